use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use std::{env, fs, thread};

use super::*;

/// Tells `owner_process`, run as a child process, which kind of server to own.
const OWNER_MODE: &str = "GITPLANE_TESTKIT_OWNER";
/// What `owner_process` prints before the postmaster's pid and the server's directory.
const OWNER_SAYS: &str = "testkit-server ";

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn each_database_is_new_and_answers() {
    let Some(server) = shared_or_skip("each_database_is_new_and_answers") else {
        return;
    };
    let first = server.database();
    let second = server.database();
    assert_ne!(first, second);
    let port = server.port();
    for url in [&first, &second] {
        assert!(url.starts_with(&format!("postgres://postgres@127.0.0.1:{port}/")));
        assert_eq!(server.psql(url, "SELECT 1").as_deref(), Ok("1\n"));
    }
    server
        .psql(&first, "CREATE TABLE marker (n int)")
        .expect("a table in the first database");
    let tables = "SELECT count(*) FROM pg_tables WHERE tablename = 'marker'";
    assert_eq!(server.psql(&first, tables).as_deref(), Ok("1\n"));
    assert_eq!(server.psql(&second, tables).as_deref(), Ok("0\n"));
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn restart_keeps_the_port_and_the_data() {
    let Some(server) = postgres_or_skip("restart_keeps_the_port_and_the_data") else {
        return;
    };
    let url = server.database();
    let port = server.port();
    server
        .psql(&url, "CREATE TABLE kept AS SELECT 42 AS n")
        .expect("a table to keep");

    server.stop();
    assert!(!answers(port), "port {port} still answers after stop()");
    assert!(server.psql(&url, "SELECT 1").is_err());

    server.start_again();
    assert_eq!(server.port(), port);
    assert_eq!(
        server.psql(&url, "SELECT n FROM kept").as_deref(),
        Ok("42\n")
    );

    server.restart();
    assert_eq!(
        server.psql(&url, "SELECT n FROM kept").as_deref(),
        Ok("42\n")
    );
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn drop_stops_the_server_and_removes_its_directory() {
    let Some(server) = postgres_or_skip("drop_stops_the_server_and_removes_its_directory") else {
        return;
    };
    let pid = postmaster_pid(&server.dir);
    let dir = server.dir.clone();
    let port = server.port();
    assert!(running(pid), "postmaster {pid} is not running");

    drop(server);
    assert!(!running(pid), "postmaster {pid} still runs after drop");
    assert!(!dir.exists(), "{} is still there after drop", dir.display());
    assert!(!answers(port), "port {port} still answers after drop");
}

#[test]
fn parallel_servers_have_ports_and_directories_of_their_own() {
    if unavailable("parallel_servers_have_ports_and_directories_of_their_own") {
        return;
    }
    let servers: Vec<Postgres> = (0..3)
        .map(|_| thread::spawn(Postgres::start))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|started| {
            started
                .join()
                .expect("a starting thread")
                .expect("a server")
        })
        .collect();
    let ports: BTreeSet<u16> = servers.iter().map(Postgres::port).collect();
    let dirs: BTreeSet<&PathBuf> = servers.iter().map(|server| &server.dir).collect();
    assert_eq!(ports.len(), 3, "ports {ports:?}");
    assert_eq!(dirs.len(), 3, "directories {dirs:?}");
    for server in &servers {
        assert_eq!(
            server.psql(&server.database(), "SELECT 1").as_deref(),
            Ok("1\n")
        );
    }
}

#[test]
fn a_killed_test_process_leaves_no_server_behind() {
    if unavailable("a_killed_test_process_leaves_no_server_behind") {
        return;
    }
    let (mut owner, said) = run_owner("own");
    let (pid, dir) = said
        .recv_timeout(Duration::from_secs(60))
        .expect("the owner's server");
    assert!(running(pid), "postmaster {pid} is not running");

    owner.kill().expect("SIGKILL to the owner");
    owner.wait().expect("the killed owner");
    let deadline = Instant::now() + Duration::from_secs(10);
    while (running(pid) || dir.exists()) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(!running(pid), "postmaster {pid} outlived its owner by 10 s");
    assert!(
        !dir.exists(),
        "{} outlived its owner by 10 s",
        dir.display()
    );
}

#[test]
fn the_shared_server_is_gone_when_its_process_has_exited() {
    if unavailable("the_shared_server_is_gone_when_its_process_has_exited") {
        return;
    }
    let (mut owner, said) = run_owner("shared");
    let (pid, dir) = said
        .recv_timeout(Duration::from_secs(60))
        .expect("the owner's server");
    let deadline = Instant::now() + Duration::from_secs(60);
    while owner.try_wait().expect("the owner's status").is_none() {
        assert!(Instant::now() < deadline, "the owner did not exit");
        thread::sleep(Duration::from_millis(5));
    }
    // The watchdog removes the directory after the server has stopped: no grace period.
    assert!(
        !dir.exists(),
        "{} is still there once its owner exited",
        dir.display()
    );
    assert!(
        !running(pid),
        "postmaster {pid} still runs once its owner exited"
    );
}

/// Not a test: the process that `a_killed_test_process_leaves_no_server_behind` and
/// `the_shared_server_is_gone_when_its_process_has_exited` start, to kill it or let it end.
#[test]
#[ignore = "run in a child process by the tests of what a process leaves behind"]
fn owner_process() {
    let Ok(mode) = env::var(OWNER_MODE) else {
        return;
    };
    let server: &Postgres = match mode.as_str() {
        "own" => Box::leak(Box::new(Postgres::start().expect("a server"))),
        _ => shared().expect("the shared server"),
    };
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "{OWNER_SAYS}{} {}",
        postmaster_pid(&server.dir),
        server.dir.display()
    )
    .expect("stdout");
    stdout.flush().expect("stdout");
    if mode == "own" {
        // Waits to be killed.
        thread::sleep(Duration::from_secs(120));
    }
}

/// Starts this test binary running `owner_process` in `mode`; the receiver gets the postmaster's
/// pid and the server's directory once the child has said them.
fn run_owner(mode: &str) -> (Child, mpsc::Receiver<(u32, PathBuf)>) {
    let mut owner = Command::new(env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "tests::owner_process",
            "--ignored",
            "--nocapture",
        ])
        .env(OWNER_MODE, mode)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the owner process");
    let stdout = owner.stdout.take().expect("the owner's stdout");
    let (tell, said) = mpsc::channel();
    thread::spawn(move || {
        // Read to the end, so that the owner never blocks on a full pipe.
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let Some(at) = line.find(OWNER_SAYS) else {
                continue;
            };
            let mut words = line[at + OWNER_SAYS.len()..].splitn(2, ' ');
            if let (Some(Ok(pid)), Some(dir)) = (words.next().map(str::parse), words.next()) {
                let _ = tell.send((pid, PathBuf::from(dir)));
            }
        }
    });
    (owner, said)
}

/// True, after printing why, when this machine has no PostgreSQL for a test to start.
fn unavailable(test: &str) -> bool {
    match Tools::find() {
        Ok(_) => false,
        Err(Unavailable(why)) => {
            eprintln!("skipped {test}: {why}");
            true
        }
    }
}

fn postmaster_pid(dir: &Path) -> u32 {
    let pid_file = dir.join("data").join("postmaster.pid");
    let text = fs::read_to_string(&pid_file).expect("postmaster.pid");
    text.lines()
        .next()
        .and_then(|line| line.trim().parse().ok())
        .expect("a pid on the first line of postmaster.pid")
}

/// Whether process `pid` exists and is not a zombie (a dead postmaster's parent may be a
/// container's init that does not reap it).
fn running(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        !matches!(state, Some('Z' | 'X'))
    })
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
fn answers(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_secs(1),
    )
    .is_ok()
}
