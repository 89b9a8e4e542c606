//! The daemon's HTTP listener under clients that try to starve it, without a token: half-open
//! connections by the thousand under systemd's default open-file limit, unsigned webhooks with
//! huge bodies, bodies over the limit or too slow, more connections than the cap; and the
//! login cookie, which holds a session and never the token.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gitplane_testkit::eventually_or;

use crate::daemon::{Daemon, open_files_limited, wait_deployed};
use crate::service::{client, free_port, get, hmac_hex, host_config, post};
use crate::util::Sandbox;

const ENVS: [&str; 2] = ["development", "production"];

/// Connects to the listener on `port` and sends `bytes`, and nothing more.
fn send(port: u16, bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to the listener");
    stream.write_all(bytes).expect("send");
    stream
}

/// What the listener sends on `stream` until it closes the connection or `within` passes, and
/// whether it closed it.
fn answer(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let deadline = Instant::now() + within;
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (String::from_utf8_lossy(&text).into_owned(), false);
        }
        stream.set_read_timeout(Some(left)).expect("read timeout");
        match stream.read(&mut buf) {
            Ok(0) => return (String::from_utf8_lossy(&text).into_owned(), true),
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (String::from_utf8_lossy(&text).into_owned(), false);
            }
            // Reset: what arrived before it is the answer.
            Err(_) => return (String::from_utf8_lossy(&text).into_owned(), true),
        }
    }
}

/// The status code of an HTTP response's text.
fn status(text: &str) -> Option<u16> {
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// `GET /healthz` over a connection of its own: the status, if the listener answered.
fn healthz(port: u16) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: gitplane\r\nConnection: close\r\n\r\n")
        .ok()?;
    status(&answer(&mut stream, Duration::from_secs(5)).0)
}

/// `VmHWM` or `VmRSS` of process `pid`, in KiB.
fn memory_kib(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// Lets this test process hold at least `files` open files (its soft limit raised towards the
/// hard one).
fn allow_open_files(files: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|c| c < files) {
        let wanted = limit.maximum.map_or(files, |m| m.min(files));
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(wanted),
                maximum: limit.maximum,
            },
        )
        .expect("raise the open-file limit");
    }
}

/// The finding: with systemd's default 1 024 open files, 1 010 connections that sent half a
/// request line stopped `/healthz`, and a push was not deployed until they closed.
#[test]
fn half_open_connections_do_not_stop_a_push_or_the_health_check() {
    let sb = Sandbox::template();
    let port = free_port();
    // The defaults: 256 connections at most, 10 s for a request's headers.
    let config = host_config(&sb, &format!("http: {{listen: 127.0.0.1:{port}}}\n"));
    let daemon = Daemon::start_with_open_files(&sb, &["--config", config.to_str().unwrap()], 1024);
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));

    allow_open_files(4096);
    let mut held: Vec<TcpStream> = (0..1010).map(|_| send(port, b"GET /heal")).collect();

    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    let pushed = Instant::now();
    let commit = sb.commit("A push while the listener is flooded");
    eventually_or(
        "the push deployed within 10 s of 1010 half-open connections",
        Duration::from_secs(10),
        || {
            (sb.count(&format!(
                "SELECT COUNT(*) FROM deployment WHERE commit_id = '{commit}' AND status = 'succeeded'"
            )) == 2)
                .then_some(())
        },
        || daemon.log(),
    );
    eprintln!("deployed {:?} after the push", pushed.elapsed());

    // The connections over the cap were answered at once.
    let busy = held
        .iter_mut()
        .map(|s| answer(s, Duration::from_millis(5)).0)
        .filter(|text| status(text) == Some(503))
        .count();
    assert!(busy >= 1010 - 256, "{busy} connections got 503");

    // The half-open ones within the cap are closed at the header timeout: the health check
    // answers again, while the test still holds every connection open.
    eventually_or(
        "/healthz to answer 200",
        Duration::from_secs(20),
        || (healthz(port) == Some(200)).then_some(()),
        || daemon.log(),
    );
    let log = daemon.log();
    assert!(!log.contains("not a git repository"), "{log}");
    assert!(log.contains("connections refused with 503"), "{log}");
    drop(held);
}

/// The finding: unsigned webhook bodies up to 25 MiB were read whole before the signature was
/// checked (20 parallel posts took the daemon from 83 to 381 MB).
#[test]
fn unsigned_webhook_bodies_are_refused_after_their_headers() {
    let sb = Sandbox::template();
    let port = free_port();
    let secret_file = sb.root.join("webhook-secret");
    std::fs::write(&secret_file, "whsec-61c0de").unwrap();
    let config = host_config(
        &sb,
        &format!(
            "http: {{listen: 127.0.0.1:{port}, webhook_secret_file: {}}}\n",
            secret_file.display()
        ),
    );
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));
    let peak_before = memory_kib(daemon.pid(), "VmHWM");

    const BODY: usize = 25 * 1024 * 1024;
    let posts = 20;
    let barrier = Arc::new(Barrier::new(posts));
    let threads: Vec<_> = (0..posts)
        .map(|i| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                // A signature header that is not one, or none at all.
                let signature = if i % 2 == 0 {
                    "X-Hub-Signature-256: sha1=0123\r\n"
                } else {
                    ""
                };
                let head = format!(
                    "POST /hooks/git HTTP/1.1\r\nHost: gitplane\r\nX-GitHub-Event: push\r\n\
                     {signature}Content-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
                );
                let mut stream = send(port, head.as_bytes());
                let (early, _) = answer(&mut stream, Duration::from_secs(5));
                barrier.wait();
                // Then the body, as fast as the listener takes it.
                let chunk = vec![b' '; 64 * 1024];
                for _ in 0..BODY / chunk.len() {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                }
                let late = if early.is_empty() {
                    answer(&mut stream, Duration::from_secs(60)).0
                } else {
                    early.clone()
                };
                (early, late)
            })
        })
        .collect();
    for thread in threads {
        let (early, late) = thread.join().expect("a post");
        assert_eq!(
            status(&early),
            Some(401),
            "not refused after its headers; after its body: {late:?}"
        );
        assert!(early.contains("missing or wrong signature"), "{early}");
    }
    let grown = memory_kib(daemon.pid(), "VmHWM").saturating_sub(peak_before);
    eprintln!("peak RSS grew by {grown} KiB");
    assert!(
        grown < 32 * 1024,
        "the daemon's peak RSS grew by {grown} KiB for {posts} refused posts"
    );

    // A signed push still goes through.
    let (code, said) = post(
        &format!("http://127.0.0.1:{port}/hooks/git"),
        &[
            ("X-Gitlab-Event", "Push Hook"),
            ("X-Gitlab-Token", "whsec-61c0de"),
        ],
        b"{}",
    );
    assert_eq!(code, 202, "{said}");
    assert!(!daemon.log().contains("whsec-61c0de"));
}

#[test]
fn bodies_over_the_limit_get_413() {
    let sb = Sandbox::template();
    let port = free_port();
    let secret = "whsec-4a77e1";
    let secret_file = sb.root.join("webhook-secret");
    std::fs::write(&secret_file, secret).unwrap();
    let token = "tok-9e1f20c7";
    let token_file = sb.root.join("http-token");
    std::fs::write(&token_file, token).unwrap();
    // The default http.max_body: 1 MiB.
    let config = host_config(
        &sb,
        &format!(
            "http:\n  listen: 127.0.0.1:{port}\n  webhook_secret_file: {}\n  token_file: {}\n",
            secret_file.display(),
            token_file.display()
        ),
    );
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    const MIB: usize = 1024 * 1024;

    // Signed, with a declared length over the limit: refused before a byte of the body.
    let head = format!(
        "POST /hooks/git HTTP/1.1\r\nHost: gitplane\r\nX-Gitlab-Event: Push Hook\r\n\
         X-Gitlab-Token: {secret}\r\nContent-Length: {}\r\n\r\n",
        2 * MIB
    );
    let (text, closed) = answer(&mut send(port, head.as_bytes()), Duration::from_secs(5));
    assert_eq!(status(&text), Some(413), "{text:?}");
    assert!(closed && text.contains("http.max_body"), "{text}");

    // Chunked, with no length said: read up to the limit, then refused.
    let head = format!(
        "POST /hooks/git HTTP/1.1\r\nHost: gitplane\r\nX-Gitlab-Event: Push Hook\r\n\
         X-Gitlab-Token: {secret}\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    let mut stream = send(port, head.as_bytes());
    let chunk = format!("10000\r\n{}\r\n", " ".repeat(0x10000));
    for _ in 0..32 {
        if stream.write_all(chunk.as_bytes()).is_err() {
            break;
        }
    }
    let (text, _) = answer(&mut stream, Duration::from_secs(10));
    assert_eq!(status(&text), Some(413), "{text:?}");

    // A signed body of the limit itself is taken.
    let body = vec![b' '; MIB];
    let signature = format!("sha256={}", hmac_hex(secret, &body));
    let (code, said) = post(
        &format!("http://127.0.0.1:{port}/hooks/git"),
        &[
            ("X-GitHub-Event", "push"),
            ("X-Hub-Signature-256", &signature),
        ],
        &body,
    );
    assert_eq!(code, 202, "{said}");

    // The login form is small.
    let mut form = format!("token={token}&pad=").into_bytes();
    form.resize(32 * 1024, b'x');
    let (code, said) = post(
        &format!("http://127.0.0.1:{port}/login"),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        &form,
    );
    assert_eq!(code, 413, "{said}");
    assert!(!daemon.log().contains(secret));
}

#[test]
fn connections_over_the_cap_get_503_at_once() {
    let sb = Sandbox::template();
    let port = free_port();
    // The default cap: 256.
    let config = host_config(&sb, &format!("http: {{listen: 127.0.0.1:{port}}}\n"));
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    assert_eq!(healthz(port), Some(200));
    let mut held: Vec<TcpStream> = (0..256).map(|_| send(port, b"GET /heal")).collect();

    let asked = Instant::now();
    let mut stream = send(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: gitplane\r\nConnection: close\r\n\r\n",
    );
    let (text, closed) = answer(&mut stream, Duration::from_secs(5));
    let took = asked.elapsed();
    assert_eq!(status(&text), Some(503), "{text:?}");
    assert!(closed, "the connection over the cap is closed");
    assert!(text.contains("\r\nConnection: close\r\n"), "{text}");
    assert!(text.contains("\r\nRetry-After: "), "{text}");
    assert!(
        text.ends_with("too many connections: try again later\n"),
        "{text}"
    );
    assert!(took < Duration::from_secs(1), "answered in {took:?}");

    // One connection less, and a client is served again.
    drop(held.pop());
    eventually_or(
        "/healthz to answer 200 with one connection less",
        Duration::from_secs(5),
        || (healthz(port) == Some(200)).then_some(()),
        || daemon.log(),
    );
    daemon.wait_for_log(
        "connections refused with 503: 256 (http.max_connections) are open",
        Duration::from_secs(5),
    );
}

#[test]
fn a_cap_the_open_file_limit_cannot_hold_stops_the_daemon() {
    let sb = Sandbox::template();
    let port = free_port();
    let config = host_config(
        &sb,
        &format!("http:\n  listen: 127.0.0.1:{port}\n  max_connections: 1000\n"),
    );
    let out = open_files_limited(512)
        .args(["daemon", "--config", config.to_str().unwrap()])
        .env_remove("GITPLANE_CONFIG")
        .output()
        .expect("run the daemon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "http.max_connections 1000 is more than the open-file limit allows: of 512 open \
             files, 128 are kept for the daemon's own files and 32 for refusing connections, \
             which leaves 352: raise LimitNOFILE (ulimit -n) or lower http.max_connections"
        ),
        "{stderr}"
    );
    // Under a limit that holds it (the unit sets 65536), the same config starts.
    let _daemon = Daemon::start_with_open_files(&sb, &["--config", config.to_str().unwrap()], 2048);
    assert_eq!(healthz(port), Some(200));
}

#[test]
fn silent_connections_are_closed_at_their_time_limits() {
    let sb = Sandbox::template();
    let port = free_port();
    let secret = "whsec-0b3d5f";
    let secret_file = sb.root.join("webhook-secret");
    std::fs::write(&secret_file, secret).unwrap();
    let config = host_config(
        &sb,
        &format!(
            "http:\n  listen: 127.0.0.1:{port}\n  webhook_secret_file: {}\n  \
             header_timeout: 1s\n  idle_timeout: 2s\n  body_timeout: 5s\n",
            secret_file.display()
        ),
    );
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    let closed_after = |stream: &mut TcpStream| {
        let started = Instant::now();
        let (text, closed) = answer(stream, Duration::from_secs(15));
        assert!(closed, "still open after 15 s: {text:?}");
        (text, started.elapsed())
    };

    // Half a request line: closed at the header timeout.
    let (text, took) = closed_after(&mut send(port, b"GET /heal"));
    assert!(!text.contains("200 OK"), "{text}");
    assert!(
        took >= Duration::from_millis(800) && took < Duration::from_secs(3),
        "{took:?}"
    );

    // A kept-alive connection that sends nothing after its answer: the same.
    let mut stream = send(port, b"GET /healthz HTTP/1.1\r\nHost: gitplane\r\n\r\n");
    let (text, took) = closed_after(&mut stream);
    assert_eq!(status(&text), Some(200), "{text}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // A signed webhook whose body stops halfway: nothing moves, closed at the idle timeout,
    // long before the body timeout.
    let head = format!(
        "POST /hooks/git HTTP/1.1\r\nHost: gitplane\r\nX-Gitlab-Event: Push Hook\r\n\
         X-Gitlab-Token: {secret}\r\nContent-Length: 100\r\n\r\n{}",
        " ".repeat(50)
    );
    let (text, took) = closed_after(&mut send(port, head.as_bytes()));
    assert_eq!(text, "", "closed without an answer");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_millis(4500),
        "{took:?}"
    );

    // A body that trickles in: cut at the body timeout.
    let head = format!(
        "POST /hooks/git HTTP/1.1\r\nHost: gitplane\r\nX-Gitlab-Event: Push Hook\r\n\
         X-Gitlab-Token: {secret}\r\nContent-Length: 100\r\n\r\n"
    );
    let mut stream = send(port, head.as_bytes());
    let started = Instant::now();
    let mut text = String::new();
    for _ in 0..40 {
        if stream.write_all(b" ").is_err() {
            break;
        }
        let (said, _) = answer(&mut stream, Duration::from_millis(500));
        text.push_str(&said);
        if !text.is_empty() {
            break;
        }
    }
    let took = started.elapsed();
    assert_eq!(status(&text), Some(408), "{text:?}");
    assert!(text.contains("http.body_timeout"), "{text}");
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(8),
        "{took:?}"
    );
    // The listener still serves.
    assert_eq!(healthz(port), Some(200), "{}", daemon.log());
}

/// `POST /login` with `form`, and `headers`: the status and the `Set-Cookie` header.
fn login(port: u16, form: &str, headers: &[(&str, &str)]) -> (u16, Option<String>) {
    let mut request = client()
        .post(format!("http://127.0.0.1:{port}/login"))
        .header("Content-Type", "application/x-www-form-urlencoded");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut response = request.send(form).expect("the listener answers");
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let _ = response.body_mut().read_to_string();
    (response.status().as_u16(), cookie)
}

#[test]
fn the_login_cookie_holds_a_session_that_ends_with_its_token() {
    let sb = Sandbox::template();
    let port = free_port();
    let token = "tok-5c1e0f93d2a7";
    let token_file = sb.root.join("http-token");
    std::fs::write(&token_file, token).unwrap();
    let config = host_config(
        &sb,
        &format!(
            "http:\n  listen: 127.0.0.1:{port}\n  token_file: {}\n",
            token_file.display()
        ),
    );
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));
    let api = format!("http://127.0.0.1:{port}/api/overview");

    let (code, cookie) = login(port, &format!("token={token}"), &[]);
    assert_eq!(code, 303);
    let set_cookie = cookie.expect("a cookie");
    assert!(!set_cookie.contains(token), "{set_cookie}");
    let pair = set_cookie.split(';').next().unwrap().to_owned();
    let (name, value) = pair.split_once('=').unwrap();
    assert_eq!(name, "gitplane_session");
    assert!(
        value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()),
        "{value}"
    );
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(!set_cookie.contains("Secure"), "plain HTTP: {set_cookie}");

    // The session works for the API, as the token does; the token is no session.
    let (code, body) = get(&api, &[("Cookie", &pair)]);
    assert_eq!(code, 200, "{body}");
    assert!(
        serde_json::from_str::<serde_json::Value>(&body).is_ok(),
        "{body}"
    );
    let bearer = format!("Bearer {token}");
    assert_eq!(get(&api, &[("Authorization", &bearer)]).0, 200);
    let forged = format!("gitplane_session={token}");
    assert_eq!(get(&api, &[("Cookie", &forged)]).0, 401);
    let old_style = format!("gitplane_token={token}");
    assert_eq!(get(&api, &[("Cookie", &old_style)]).0, 401);

    // Behind a TLS proxy the cookie travels over HTTPS alone; each sign-in is its own session.
    let (code, cookie) = login(
        port,
        &format!("token={token}"),
        &[("X-Forwarded-Proto", "https")],
    );
    assert_eq!(code, 303);
    let secure = cookie.expect("a cookie");
    assert!(secure.contains("; Secure"), "{secure}");
    assert_ne!(secure.split(';').next().unwrap(), pair);

    // A wrong token gets no session.
    let (code, cookie) = login(port, "token=tok-guess", &[]);
    assert_eq!(code, 401);
    assert_eq!(cookie, None);

    // SIGHUP with a new token ends the sessions of the old one.
    std::fs::write(&token_file, "tok-rotated-7d20b6").unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    daemon.wait_for_log("host config reloaded", Duration::from_secs(10));
    assert_eq!(get(&api, &[("Cookie", &pair)]).0, 401);
    let (code, cookie) = login(port, "token=tok-rotated-7d20b6", &[]);
    assert_eq!(code, 303);
    let fresh = cookie.expect("a cookie");
    let fresh = fresh.split(';').next().unwrap();
    assert_eq!(get(&api, &[("Cookie", fresh)]).0, 200);
    let log = daemon.log();
    for secret in [token, "tok-rotated-7d20b6"] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
    assert!(!log.contains(&value[..16]), "a session id in the log");
}
