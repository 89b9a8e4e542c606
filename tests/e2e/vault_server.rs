//! A real HTTP server on 127.0.0.1 that answers HashiCorp Vault's KV version 2 read
//! (`GET /v1/<mount>/data/<path>[?version=N]`) the way Vault does: 403 without the right
//! `X-Vault-Token`, 404 for an unknown path or version, and each write a new version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gitplane_testkit::{HttpServer, Reply, Request};
use serde_json::{Value, json};

pub struct VaultServer {
    /// `http://127.0.0.1:PORT`, the url to configure.
    pub url: String,
    /// Every versions of every secret, by path under the `secret` mount.
    secrets: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    server: HttpServer,
}

impl VaultServer {
    pub fn start(token: &str) -> VaultServer {
        let secrets: Arc<Mutex<HashMap<String, Vec<Value>>>> = Arc::default();
        let (s, token) = (secrets.clone(), token.to_owned());
        let server = HttpServer::start(move |request| {
            let (status, body) = answer(request, &token, &s);
            Reply::text(status, body.to_string())
        });
        VaultServer {
            url: server.url.clone(),
            secrets,
            server,
        }
    }

    /// Writes a new version of the secret at `path`.
    pub fn put(&self, path: &str, data: Value) {
        let mut secrets = self.secrets.lock().unwrap_or_else(|e| e.into_inner());
        secrets.entry(path.to_owned()).or_default().push(data);
    }

    /// The URL of every read, in order.
    pub fn reads(&self) -> Vec<String> {
        self.server
            .requests()
            .into_iter()
            .map(|logged| logged.request.url)
            .collect()
    }
}

fn answer(
    request: &Request,
    token: &str,
    secrets: &Mutex<HashMap<String, Vec<Value>>>,
) -> (u16, Value) {
    let url = &request.url;
    if request.header("X-Vault-Token") != Some(token) {
        return (403, json!({"errors": ["permission denied"]}));
    }
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let Some(path) = path.strip_prefix("/v1/secret/data/") else {
        return (404, json!({"errors": []}));
    };
    let secrets = secrets.lock().unwrap_or_else(|e| e.into_inner());
    let Some(versions) = secrets.get(path) else {
        return (404, json!({"errors": []}));
    };
    let version = match query.strip_prefix("version=") {
        Some(v) => v.parse::<usize>().unwrap_or(0),
        None => versions.len(),
    };
    match version.checked_sub(1).and_then(|i| versions.get(i)) {
        Some(data) => (
            200,
            json!({"data": {"data": data, "metadata": {"version": version, "destroyed": false}}}),
        ),
        None => (404, json!({"errors": []})),
    }
}
