//! Drivers provision one resource per call, idempotently per GUResID; this module holds the
//! interface and the registry that maps a definition's `driver_type` to a driver.

mod echo;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

pub use echo::EchoDriver;

/// A request to create or update one resource.
#[derive(Debug, Clone, Copy)]
pub struct PutRequest<'a> {
    pub guresid: &'a str,
    pub env: &'a str,
    pub app: Option<&'a str>,
    pub res_type: &'a str,
    pub class: &'a str,
    pub res_id: &'a str,
    /// The resource's own inputs: Score params, or a workload's resolved Score file.
    pub resource: &'a Value,
    pub values: &'a Value,
    pub secrets: &'a Value,
}

/// A request to delete one resource.
#[derive(Debug, Clone, Copy)]
pub struct DeleteRequest<'a> {
    pub guresid: &'a str,
    pub env: &'a str,
    pub app: Option<&'a str>,
    pub res_type: &'a str,
    pub class: &'a str,
    pub res_id: &'a str,
}

/// What a driver returns for a provisioned resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Provisioned {
    /// A JSON object.
    pub outputs: Value,
    /// A JSON object; recorded apart and never shown.
    pub secret_outputs: Value,
}

/// A driver call that did not succeed. The message must not contain secret values.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct DriverError {
    pub message: String,
}

/// One way of provisioning resources.
pub trait Driver: Send + Sync {
    fn put(&self, request: &PutRequest<'_>) -> Result<Provisioned, DriverError>;
    fn delete(&self, request: &DeleteRequest<'_>) -> Result<(), DriverError>;
}

/// Drivers by `driver_type`.
#[derive(Clone)]
pub struct Registry {
    drivers: BTreeMap<String, Arc<dyn Driver>>,
}

impl Registry {
    /// The built-in drivers: `echo` (also `humanitec/echo`).
    pub fn builtin() -> Self {
        let echo: Arc<dyn Driver> = Arc::new(EchoDriver);
        let mut drivers = BTreeMap::new();
        drivers.insert("echo".to_owned(), echo.clone());
        drivers.insert("humanitec/echo".to_owned(), echo);
        Registry { drivers }
    }

    pub fn get(&self, driver_type: &str) -> Option<&Arc<dyn Driver>> {
        self.drivers.get(driver_type)
    }

    /// Every registered `driver_type`, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.drivers.keys().map(String::as_str)
    }
}
