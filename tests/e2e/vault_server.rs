//! A real HTTP server on 127.0.0.1 that answers HashiCorp Vault's KV version 2 read
//! (`GET /v1/<mount>/data/<path>[?version=N]`) the way Vault does: 403 without the right
//! `X-Vault-Token`, 404 for an unknown path or version, and each write a new version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;

use serde_json::{Value, json};

pub struct VaultServer {
    /// `http://127.0.0.1:PORT`, the url to configure.
    pub url: String,
    /// Every versions of every secret, by path under the `secret` mount.
    secrets: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    reads: Arc<Mutex<Vec<String>>>,
    server: Arc<tiny_http::Server>,
}

impl VaultServer {
    pub fn start(token: &str) -> VaultServer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0"));
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let secrets: Arc<Mutex<HashMap<String, Vec<Value>>>> = Arc::default();
        let reads: Arc<Mutex<Vec<String>>> = Arc::default();
        let (s, r, srv, token) = (
            secrets.clone(),
            reads.clone(),
            server.clone(),
            token.to_owned(),
        );
        thread::spawn(move || {
            for request in srv.incoming_requests() {
                let (status, body) = answer(&request, &token, &s, &r);
                let _ = request.respond(
                    tiny_http::Response::from_string(body.to_string()).with_status_code(status),
                );
            }
        });
        VaultServer {
            url: format!("http://127.0.0.1:{port}"),
            secrets,
            reads,
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
        self.reads.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for VaultServer {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

fn answer(
    request: &tiny_http::Request,
    token: &str,
    secrets: &Mutex<HashMap<String, Vec<Value>>>,
    reads: &Mutex<Vec<String>>,
) -> (u16, Value) {
    let url = request.url().to_owned();
    reads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(url.clone());
    let given = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("X-Vault-Token"))
        .map(|h| h.value.to_string());
    if given.as_deref() != Some(token) {
        return (403, json!({"errors": ["permission denied"]}));
    }
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
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
