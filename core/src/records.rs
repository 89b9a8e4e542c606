//! What gitplane records of an environment, as plain data: the resources, their links and
//! bindings. The state crate stores and reads these; planning compares a graph with them.

use serde_json::Value;

/// A provisioned resource as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceRecord {
    pub guresid: String,
    pub env: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub definition: String,
    pub driver: String,
    /// The resource account the definition names; a delete needs its credentials again.
    pub account: Option<String>,
    /// What happens when the resource leaves the graph.
    pub deletion_policy: DeletionPolicy,
    /// Digest of its definition's templates; with `auto_update: false`, only a change of these
    /// updates the resource.
    pub template_hash: String,
    pub status: ResourceStatus,
    pub inputs_hash: String,
    /// Non-secret outputs, a JSON object.
    pub outputs: Value,
    /// Secret outputs, a JSON object; never shown, only fed to dependent resources.
    pub secret_outputs: Value,
    /// The non-secret inputs last sent to the driver: `{"resource", "values"}`, parsed only when
    /// needed (a delete, a plan's list of changes).
    pub inputs: StoredJson,
    /// The secret inputs last sent, a JSON object; a delete sends them again.
    pub secret_inputs: StoredJson,
    pub error: Option<String>,
    pub commit_id: String,
}

/// A JSON column as gitplane wrote it (`serde_json`'s text of a value, keys sorted), parsed only
/// when asked: most runs compare it or pass it on, and a workload's inputs are a whole Score file.
///
/// Two equal values have equal text, so comparing the text compares the values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredJson(String);

impl StoredJson {
    pub fn new(value: &Value) -> Self {
        StoredJson(value.to_string())
    }

    /// Takes JSON text the caller wrote as `serde_json` writes a value: compact, keys sorted.
    pub fn from_text(text: String) -> Self {
        StoredJson(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its text, for whoever stores or seals it.
    pub fn into_text(self) -> String {
        self.0
    }

    pub fn parse(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// Whether it holds `value`.
    pub fn holds(&self, value: &Value) -> bool {
        // Text against text: `String == Value` would compare with a JSON string instead.
        let text = value.to_string();
        self.0 == text
    }
}

impl Default for StoredJson {
    fn default() -> Self {
        StoredJson("{}".to_owned())
    }
}

impl From<Value> for StoredJson {
    fn from(value: Value) -> Self {
        StoredJson::new(&value)
    }
}

/// What happens to a resource that leaves the graph (a definition's `deletion_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeletionPolicy {
    /// Its driver deletes it.
    #[default]
    Delete,
    /// gitplane forgets it; the resource itself stays.
    Orphan,
}

impl DeletionPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            DeletionPolicy::Delete => "delete",
            DeletionPolicy::Orphan => "orphan",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceStatus {
    Ready,
    Failed,
}

impl ResourceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceStatus::Ready => "ready",
            ResourceStatus::Failed => "failed",
        }
    }
}

/// An edge of an environment's graph as a link (ConfigHub's model): `consumer` depends on
/// `provider`. State keeps one record of each, serving deletion order and the links report.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkRecord {
    pub consumer: String,
    pub provider: String,
    pub kind: String,
    /// `NeedsProvides`, `None` or `Insert`.
    pub update_type: String,
}

/// A resolved placeholder: which value of which provider reached which input of a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingRecord {
    pub needed: String,
    pub needed_path: String,
    pub provided: String,
    pub provided_path: String,
    /// `string`, `int`, `bool` or `json`.
    pub data_type: String,
    /// `None` for a secret.
    pub value: Option<Value>,
    pub secret: bool,
    pub inserted: bool,
    /// Read through an interface: `NAME = $id`, the consumer's name for the provider's output.
    pub interface: Option<String>,
}
