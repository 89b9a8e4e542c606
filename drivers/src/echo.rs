//! The `echo` driver: a resource's outputs are its `values`, its secret outputs its `secrets`.

use std::collections::BTreeSet;

use serde_json::Value;

use super::{Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, PutOutcome, ReadOutcome};

/// Provisions nothing; it passes its inputs through, as Humanitec's `humanitec/echo` does.
#[derive(Debug, Clone, Copy, Default)]
pub struct EchoDriver;

fn object_or_empty(v: &Value) -> Value {
    match v {
        Value::Object(_) => v.clone(),
        _ => Value::Object(Default::default()),
    }
}

impl Driver for EchoDriver {
    /// Its outputs are a pure function of the request: reading is computing them again.
    fn read(&self, request: &DriverRequest<'_>) -> Result<ReadOutcome, DriverError> {
        super::read_by_recomputing(self, request)
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        Ok(PutOutcome::Done {
            outputs: object_or_empty(request.values),
            secret_outputs: object_or_empty(request.secrets),
            cookie: Cookie::Unchanged,
            manifests: Vec::new(),
        })
    }

    fn delete(&self, _request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        Ok(DeleteOutcome::Done)
    }

    fn in_process(&self) -> bool {
        true
    }

    /// Its values' and secrets' names, when each is written as a mapping (or not at all).
    fn known_outputs(&self, values: &Value, secrets: &Value) -> Option<BTreeSet<String>> {
        let mut known = BTreeSet::new();
        for inputs in [values, secrets] {
            match inputs {
                Value::Null => {}
                Value::Object(map) => known.extend(map.keys().cloned()),
                // One placeholder for the whole section: known after it resolves.
                _ => return None,
            }
        }
        Some(known)
    }
}
