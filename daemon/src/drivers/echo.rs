//! The `echo` driver: a resource's outputs are its `values`, its secret outputs its `secrets`.

use serde_json::Value;

use super::{DeleteRequest, Driver, DriverError, Provisioned, PutRequest};

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
    fn put(&self, request: &PutRequest<'_>) -> Result<Provisioned, DriverError> {
        Ok(Provisioned {
            outputs: object_or_empty(request.values),
            secret_outputs: object_or_empty(request.secrets),
        })
    }

    fn delete(&self, _request: &DeleteRequest<'_>) -> Result<(), DriverError> {
        Ok(())
    }
}
