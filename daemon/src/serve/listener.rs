//! The listener's accept loop: a cap on open connections (a permit taken before a
//! connection's task is spawned), header and idle time limits on each connection, and accept
//! errors reported for what they are.
//!
//! Anyone who can reach the port gets this far, token or not, so nothing a client does here may
//! hold more than its share: a connection over the cap is answered `503` at once without its
//! request being read, one that sends its headers too slowly, or lets nothing move for too
//! long, is closed. The cap also keeps file descriptors for the daemon's own work (the state,
//! git, drivers): clients cannot use them up.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tracing::{debug, error, warn};

use super::{ServeError, Shared, router};
use crate::config::{DEFAULT_MAX_CONNECTIONS, HttpConfig, HttpLimits};

/// Open files kept for the daemon's own work whatever the clients do: its state (three per
/// SQLite connection), git's packs, inotify, the pipes of exec drivers and terraform, the
/// sockets of HTTP drivers, secret stores and notifications.
const RESERVED_FILES: u64 = 128;
/// Refused connections kept open a moment after their 503, at most, so that their clients read
/// it rather than a reset; past that they are closed at once.
const REFUSING: usize = 32;
/// A connection's buffer, and so a request's headers, at most: 256 connections buffer 16 MiB.
const MAX_BUF: usize = 64 * 1024;
/// How often each kind of trouble of the accept loop is logged, at most.
const REPORT_EVERY: Duration = Duration::from_secs(10);
/// How long the accept loop waits after a failed accept that is not the client's doing, so
/// that it does not spin while the cause lasts.
const BACKOFF: Duration = Duration::from_millis(100);

/// The answer to a connection over the cap, written without reading its request.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
    Connection: close\r\n\
    Retry-After: 5\r\n\
    Content-Type: text/plain; charset=utf-8\r\n\
    Content-Length: 38\r\n\
    \r\n\
    too many connections: try again later\n";

/// A bound listener and what it may hold.
pub struct Bound {
    tcp: TcpListener,
    /// Connections served at once, the open-file limit considered.
    max_connections: usize,
    limits: HttpLimits,
}

/// Binds the listener: before the daemon's first reconcile, so a port in use, or a connection
/// cap the open-file limit cannot give, stops it at once.
pub async fn bind(config: &HttpConfig) -> Result<Bound, ServeError> {
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let max_connections = connection_cap(config.limits.max_connections, open_files)?;
    if config.limits.max_connections.is_none() && max_connections < DEFAULT_MAX_CONNECTIONS {
        warn!(
            open_files,
            max_connections,
            "the open-file limit leaves room for {max_connections} HTTP connections, fewer than \
             the default {DEFAULT_MAX_CONNECTIONS}: raise LimitNOFILE"
        );
    }
    let tcp = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    Ok(Bound {
        tcp,
        max_connections,
        limits: config.limits,
    })
}

/// The connections the listener may hold: `asked` (the default when `None`) if the open-file
/// soft limit (`None`: unlimited) leaves room for them beside the daemon's own files and the
/// refusals under way. The default is lowered to fit; a number asked for is not.
fn connection_cap(asked: Option<usize>, open_files: Option<u64>) -> Result<usize, ServeError> {
    let allowed = match open_files {
        None => usize::MAX,
        Some(n) => {
            let left = n.saturating_sub(RESERVED_FILES + REFUSING as u64);
            usize::try_from(left).unwrap_or(usize::MAX)
        }
    };
    match asked {
        Some(n) if n <= allowed => Ok(n),
        None if allowed >= 1 => Ok(DEFAULT_MAX_CONNECTIONS.min(allowed)),
        _ => {
            let budget = format!(
                "of {} open files, {RESERVED_FILES} are kept for the daemon's own files and \
                 {REFUSING} for refusing connections, which leaves {allowed}: raise LimitNOFILE \
                 (ulimit -n)",
                open_files.unwrap_or(u64::MAX)
            );
            Err(ServeError::OpenFiles(match asked {
                Some(n) => format!(
                    "http.max_connections {n} is more than the open-file limit allows: {budget} \
                     or lower http.max_connections"
                ),
                None => {
                    format!("the open-file limit leaves no room for HTTP connections: {budget}")
                }
            }))
        }
    }
}

/// Serves until `stop` turns true, then lets the open connections finish their responses.
pub async fn serve(
    bound: Bound,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let Bound {
        tcp,
        max_connections,
        limits,
    } = bound;
    // Each connection's task holds one permit from before it is spawned until it ends.
    let permits = Arc::new(Semaphore::new(max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING));
    let service = TowerToHyperService::new(router(shared));
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_BUF);
    let mut out_of_files = Reported::default();
    let mut refused = Reported::default();
    let mut failed = Reported::default();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            accepted = tcp.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if is_out_of_files(&e) => {
                if let Some(n) = out_of_files.hit(Instant::now()) {
                    error!(
                        failed = n,
                        "http listener: out of file descriptors (raise LimitNOFILE): {e}"
                    );
                }
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
            // The client gave up before it was accepted: nothing is wrong here.
            Err(e) if is_the_clients(&e) => continue,
            Err(e) => {
                if let Some(n) = failed.hit(Instant::now()) {
                    warn!(failed = n, "http listener: cannot accept a connection: {e}");
                }
                tokio::time::sleep(BACKOFF).await;
                continue;
            }
        };
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let watched = Watched::new(stream);
                let activity = watched.activity.clone();
                let connection = serve_connection(
                    builder.serve_connection(TokioIo::new(watched), service.clone()),
                    activity,
                    limits.idle_timeout,
                    stop.clone(),
                );
                tokio::spawn(async move {
                    let _permit = permit;
                    connection.await;
                });
            }
            Err(_) => {
                if let Some(n) = refused.hit(Instant::now()) {
                    warn!(
                        refused = n,
                        "http listener: connections refused with 503: {max_connections} \
                         (http.max_connections) are open"
                    );
                }
                refuse(stream, &refusing);
            }
        }
    }
    // Every connection was told to stop with `stop`: each gives its permit back once done.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let _ = permits.acquire_many(all).await;
    Ok(())
}

/// Runs one connection until it ends, nothing moved on it for `idle`, or the daemon stops
/// (which lets a response under way finish).
async fn serve_connection<S>(
    connection: http1::Connection<TokioIo<Watched>, S>,
    activity: Arc<Activity>,
    idle: Duration,
    mut stop: watch::Receiver<bool>,
) where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        let idle_until = activity.last() + idle;
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    debug!("http connection ended: {e}");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
            () = tokio::time::sleep_until(idle_until) => {
                if activity.last() + idle <= Instant::now() {
                    debug!("http connection closed: nothing moved for {idle:?}");
                    return;
                }
            }
        }
    }
}

/// Answers a connection over the cap with `503` without reading its request, and closes it.
fn refuse(stream: TcpStream, refusing: &Arc<Semaphore>) {
    // A new connection's send buffer is empty: the answer goes out without waiting.
    let _ = stream.try_write(BUSY);
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return;
    };
    // Closing a socket whose request was not read resets the connection, and the client may
    // then lose the answer: end our side and give the client a moment to close its own,
    // discarding a bounded amount of what it sends meanwhile.
    tokio::spawn(async move {
        let _permit = permit;
        let mut stream = stream;
        let _ = stream.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let mut buf = [0u8; 4096];
            let mut left = 64 * 1024usize;
            while left > 0 {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        })
        .await;
    });
}

/// EMFILE or ENFILE: the process, or the system, has no file descriptor left.
fn is_out_of_files(e: &io::Error) -> bool {
    use rustix::io::Errno;
    matches!(
        Errno::from_io_error(e),
        Some(Errno::MFILE) | Some(Errno::NFILE)
    )
}

/// A failed accept caused by the client, who reset or aborted the connection.
fn is_the_clients(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// A kind of trouble logged at most once every [`REPORT_EVERY`], with how often it happened.
#[derive(Default)]
struct Reported {
    last: Option<Instant>,
    since: u64,
}

impl Reported {
    /// Counts one more at `now`; `Some(count)` when it is time to log them.
    fn hit(&mut self, now: Instant) -> Option<u64> {
        self.since += 1;
        if self.last.is_some_and(|t| now < t + REPORT_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

/// When a byte last moved on a connection, either way.
struct Activity {
    opened: Instant,
    /// Milliseconds from `opened`.
    last: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let millis = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(millis, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.last.load(Ordering::Relaxed))
    }
}

/// A client's connection that notes when a byte last moved.
struct Watched {
    stream: TcpStream,
    activity: Arc<Activity>,
}

impl Watched {
    fn new(stream: TcpStream) -> Watched {
        Watched {
            stream,
            activity: Arc::new(Activity {
                opened: Instant::now(),
                last: AtomicU64::new(0),
            }),
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_room_for_the_daemons_own_files() {
        // systemd's default soft limit: the default cap fits.
        assert_eq!(connection_cap(None, Some(1024)).unwrap(), 256);
        assert_eq!(connection_cap(Some(800), Some(1024)).unwrap(), 800);
        assert_eq!(connection_cap(Some(5000), None).unwrap(), 5000);
        // A small limit lowers the default, and refuses a number asked for.
        assert_eq!(connection_cap(None, Some(260)).unwrap(), 100);
        let e = connection_cap(Some(1000), Some(1024))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "http.max_connections 1000 is more than the open-file limit allows: of 1024 open \
             files, 128 are kept for the daemon's own files and 32 for refusing connections, \
             which leaves 864: raise LimitNOFILE (ulimit -n) or lower http.max_connections"
        );
        let e = connection_cap(None, Some(100)).unwrap_err().to_string();
        assert!(
            e.starts_with("the open-file limit leaves no room for HTTP connections"),
            "{e}"
        );
    }

    #[test]
    fn running_out_of_files_is_told_apart() {
        assert!(is_out_of_files(&io::Error::from_raw_os_error(
            rustix::io::Errno::MFILE.raw_os_error()
        )));
        assert!(is_out_of_files(&io::Error::from_raw_os_error(
            rustix::io::Errno::NFILE.raw_os_error()
        )));
        assert!(!is_out_of_files(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
        assert!(is_the_clients(&io::Error::from(
            io::ErrorKind::ConnectionAborted
        )));
    }

    #[test]
    fn trouble_is_logged_at_most_once_in_a_while() {
        let mut r = Reported::default();
        let t = Instant::now();
        assert_eq!(r.hit(t), Some(1));
        assert_eq!(r.hit(t + Duration::from_secs(1)), None);
        assert_eq!(r.hit(t + Duration::from_secs(9)), None);
        assert_eq!(r.hit(t + REPORT_EVERY), Some(3));
        assert_eq!(r.hit(t + REPORT_EVERY), None);
    }
}
