//! Batches of the journal written on a connection of their own, in order, while the caller
//! prepares the next: a first apply's in-process answers, tens of thousands of rows, cost the
//! apply the time of its slowest side rather than of both.
//!
//! Only batches whose operations have no effect outside gitplane go here (a driver that answers
//! in process): whatever the caller does before such a batch is committed is redone by the next
//! run should the process stop, and a failed batch takes the one written before it in the same
//! transaction with it. Before anything with an effect outside (a driver call) or any other
//! write, the caller waits for every batch sent to be committed ([`JournalWriter::drain`]), so
//! the journal's order and "journalled before it is acted on" hold as they do with one
//! connection.

use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::db::DbError;
use crate::{
    Batch, BatchCommitting, BindingRecord, JournalEntry, ManifestsRecord, ResourceRecord, Result,
    SealedPut, StateError, Store,
};

/// An operation of a batch, as [`crate::OperationStart`] says it, owned.
#[derive(Debug, Clone)]
pub struct StartRow {
    pub guresid: String,
    pub app: Option<String>,
    pub res_type: String,
    pub class: String,
    pub res_id: String,
    pub action: &'static str,
    pub reason: String,
}

/// A put that started and ended in its batch: what [`JournalEntry::Put`] says, owned.
#[derive(Debug)]
pub struct EndedPut {
    pub attempts: i64,
    pub record: Box<ResourceRecord>,
    pub outputs_changed: Option<bool>,
    pub new: bool,
    pub manifests: Option<ManifestsRecord>,
    /// The record and manifests sealed by the caller ([`crate::Sealer`]): made here if not.
    pub sealed: Option<SealedPut>,
}

/// One transaction's writes: operations started and ended here (`starts[k]` ended as
/// `puts[k]`), and the bindings taken so far.
pub struct OwnedBatch {
    pub deployment: i64,
    pub env: String,
    pub starts: Vec<StartRow>,
    pub puts: Vec<EndedPut>,
    pub bindings: Vec<(String, bool, Vec<BindingRecord>)>,
    /// What the caller no longer needs but must keep until the batch is written. A batch comes
    /// back to the caller's thread to be freed there, once written: freeing tens of thousands
    /// of records and resolved inputs costs about a sixth of writing them, and the writer's
    /// thread is the one the apply waits for.
    pub spent: Box<dyn Send>,
}

/// What the caller hands the writer's thread.
enum ToWrite {
    Batch(OwnedBatch),
    /// Commit what is written: the caller is about to read or write the state itself.
    Commit,
}

/// How the writer's thread answered one [`ToWrite`].
enum Answer {
    /// Written, in the open transaction or a committed one: the caller may free it.
    Written(OwnedBatch),
    /// Everything written so far is committed.
    Committed,
    Failed(StateError),
    /// An earlier batch failed: this one was not written, so the journal keeps its order.
    Skipped(OwnedBatch),
}

/// How many batches one transaction of the writer holds at most. Each commit writes every page
/// a batch touched to the log: the indexes of GUResIDs take their rows at random pages, so
/// a first apply of tens of thousands of resources rewrote most of those indexes at each
/// commit. Two batches a commit halve that, and hold the write lock for a tenth of a second.
const BATCHES_PER_COMMIT: usize = 2;

/// How many of the writer's commits go between two checkpoints of the log into the file, which
/// another thread takes (see [`Checkpoints`]). A commit of two batches writes about 10 MB of
/// log; three make about the log SQLite's own checkpoints let grow (32 MB).
const COMMITS_PER_CHECKPOINT: usize = 3;

/// Writes [`OwnedBatch`]es in the order sent, on its own connection and thread, up to
/// [`BATCHES_PER_COMMIT`] in one transaction; [`JournalWriter::drain`] commits what is open. One
/// batch is written at a time and one more may wait for it, so the caller goes on preparing the
/// next while the writer is busy: what waits in memory is bounded by three batches.
pub struct JournalWriter {
    batches: Option<mpsc::SyncSender<ToWrite>>,
    written: mpsc::Receiver<Answer>,
    /// What was sent whose answer has not been read.
    in_flight: usize,
    /// Batches sent since the last commit asked for.
    uncommitted: bool,
    /// A batch failed: nothing sent after it is written, and every call says so.
    failed: bool,
    thread: Option<JoinHandle<()>>,
    path: std::path::PathBuf,
}

/// Checkpoints of a SQLite log taken on a thread and connection of their own while the
/// journal's writer commits: a checkpoint copies tens of megabytes into the file and syncs it,
/// and the writer, whose thread the apply waits for, would otherwise take it within a commit.
/// The writer tells of each commit; every [`COMMITS_PER_CHECKPOINT`]th starts one, and one
/// more copies the rest once the writer ends. The thread is not waited for: it ends with that
/// checkpoint, and a checkpoint cut short (the process exits) leaves the log whole, for the
/// next one.
struct Checkpoints {
    commits: mpsc::Sender<()>,
}

impl Checkpoints {
    /// For the SQLite state of `store`; `None` on PostgreSQL, which has no log of this kind.
    fn start(store: &Store) -> Result<Option<Checkpoints>> {
        if store.backend() != crate::db::Backend::Sqlite {
            return Ok(None);
        }
        let own = store.connect_again()?;
        let (commits, told) = mpsc::channel::<()>();
        // Not joined (see above).
        std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                let mut since = 0;
                while told.recv().is_ok() {
                    since += 1 + told.try_iter().count();
                    // A checkpoint that fails (the disk is full, say) leaves the log as it
                    // is: the writer's commits are in it, and a later checkpoint copies them.
                    if since >= COMMITS_PER_CHECKPOINT && own.checkpoint().is_ok() {
                        since = 0;
                    }
                }
                // The writer ended: a last checkpoint copies the rest while the caller goes on
                // (recording the graph), rather than within one of the caller's commits.
                if since > 0 {
                    let _ = own.checkpoint();
                }
            })
            .map_err(|e| stopped(store.path(), &e.to_string()))?;
        Ok(Some(Checkpoints { commits }))
    }

    fn committed(&self) {
        let _ = self.commits.send(());
    }
}

impl JournalWriter {
    /// Starts a writer on another connection to `store`'s state (its key and fences).
    pub fn start(store: &Store) -> Result<JournalWriter> {
        let mut own = store.connect_again()?;
        let checkpoints = Checkpoints::start(store)?;
        if checkpoints.is_some() {
            own.leave_checkpoints()?;
        }
        let (batches, to_write) = mpsc::sync_channel::<ToWrite>(1);
        let (answers, written) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || write_all(&mut own, &to_write, &answers, checkpoints.as_ref()))
            .map_err(|e| stopped(store.path(), &e.to_string()))?;
        Ok(JournalWriter {
            batches: Some(batches),
            written,
            in_flight: 0,
            uncommitted: false,
            failed: false,
            thread: Some(thread),
            path: store.path().to_owned(),
        })
    }

    /// Sends `batch` to be written after those sent before. Returns the error of an earlier
    /// batch, if one failed (this one is then not written).
    pub fn send(&mut self, batch: OwnedBatch) -> Result<()> {
        self.answered(false)?;
        self.uncommitted = true;
        self.hand_over(ToWrite::Batch(batch))
    }

    /// Waits until every batch sent is committed; the first error, if one failed.
    pub fn drain(&mut self) -> Result<()> {
        if std::mem::take(&mut self.uncommitted) {
            self.hand_over(ToWrite::Commit)?;
        }
        self.answered(true)
    }

    fn hand_over(&mut self, what: ToWrite) -> Result<()> {
        let sent = self.batches.as_ref().map(|b| b.send(what));
        match sent {
            Some(Ok(())) => {
                self.in_flight += 1;
                Ok(())
            }
            _ => Err(self.thread_ended()),
        }
    }

    /// Reads the answers that came (`wait`: all of them): the first failure's error when it
    /// comes, and after it an error saying an earlier batch failed.
    fn answered(&mut self, wait: bool) -> Result<()> {
        let mut first = None;
        let failed_before = self.failed;
        while self.in_flight > 0 {
            let answer = if wait {
                self.written.recv().ok()
            } else {
                match self.written.try_recv() {
                    Ok(a) => Some(a),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => None,
                }
            };
            let Some(answer) = answer else {
                self.in_flight = 0;
                return Err(first.unwrap_or_else(|| self.thread_ended()));
            };
            self.in_flight -= 1;
            match answer {
                Answer::Failed(e) => {
                    self.failed = true;
                    first.get_or_insert(e);
                }
                // Freed here, on the caller's thread (see `OwnedBatch::spent`).
                Answer::Written(batch) | Answer::Skipped(batch) => drop(batch),
                Answer::Committed => {}
            }
        }
        match first {
            Some(e) => Err(e),
            None if failed_before => Err(stopped(
                &self.path,
                "an earlier batch was not written, nor anything sent after it",
            )),
            None => Ok(()),
        }
    }

    fn thread_ended(&self) -> StateError {
        stopped(&self.path, "its thread ended")
    }
}

impl Drop for JournalWriter {
    /// Lets the batches sent be written and committed, then ends the thread.
    fn drop(&mut self) {
        self.batches = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn stopped(path: &std::path::Path, why: &str) -> StateError {
    crate::state_error(
        path,
        DbError::Lost(format!("the journal's writer stopped: {why}")),
    )
}

/// The writer's thread: writes what comes in order, a transaction for up to
/// [`BATCHES_PER_COMMIT`] batches, until the caller hangs up (what is open is then committed).
/// After a failure, nothing more is written.
///
/// On PostgreSQL a transaction's commit is sent without waiting for it, and the next
/// transaction is prepared and sent while the server still works on it: the server, not the
/// writer, is what a first apply waits for, and it never idles while a batch is gathered. The
/// writer waits for each commit before it sends the next one, so transactions commit in order
/// and none after one that failed.
fn write_all(
    own: &mut Store,
    to_write: &mpsc::Receiver<ToWrite>,
    answers: &mpsc::Sender<Answer>,
    checkpoints: Option<&Checkpoints>,
) {
    let answer = |a: Answer| answers.send(a).is_ok();
    // A batch that opens the next transaction, taken while the last one was full.
    let mut next: Option<OwnedBatch> = None;
    // The last transaction's commit, sent and not yet answered.
    let mut committing: Option<BatchCommitting> = None;
    let committed = |committing: &mut Option<BatchCommitting>| -> Result<()> {
        if let Some(c) = committing.take() {
            c.wait()?;
            if let Some(checkpoints) = checkpoints {
                checkpoints.committed();
            }
        }
        Ok(())
    };
    loop {
        let first = match next.take() {
            Some(batch) => batch,
            None => match to_write.recv() {
                Ok(ToWrite::Batch(batch)) => batch,
                Ok(ToWrite::Commit) => match committed(&mut committing) {
                    Ok(()) if answer(Answer::Committed) => continue,
                    Ok(()) => return,
                    // The answer to the commit asked for.
                    Err(e) => return fail(to_write, answers, e),
                },
                Err(_) => {
                    // Hung up: the caller, dropping the writer, waits for what it sent.
                    let _ = committed(&mut committing);
                    return;
                }
            },
        };
        let mut tx = match own.pipelined_batch() {
            Ok(tx) => tx,
            // The answer to `first`, not written.
            Err(e) => return fail(to_write, answers, e),
        };
        let mut written = 0;
        let mut batch = Some(first);
        // Whether the caller asked for the commit (and waits for its answer), or hung up.
        let mut asked = false;
        let mut hung_up = false;
        while let Some(b) = batch.take() {
            match write(&mut tx, b) {
                Ok(b) => {
                    if !answer(Answer::Written(b)) {
                        return;
                    }
                    written += 1;
                }
                Err(e) => {
                    // Rolled back: none of the transaction's batches is written. Should the
                    // one before have failed at its commit, that is the first failure.
                    drop(tx);
                    let first = committed(&mut committing).err().unwrap_or(e);
                    return fail(to_write, answers, first);
                }
            }
            match to_write.recv() {
                Ok(ToWrite::Batch(b)) if written < BATCHES_PER_COMMIT => batch = Some(b),
                Ok(ToWrite::Batch(b)) => next = Some(b),
                Ok(ToWrite::Commit) => asked = true,
                Err(_) => hung_up = true,
            }
        }
        // This transaction rests on the one before: it commits only once that one did.
        // A failure answers the commit asked for, or the batch that would have opened the
        // next transaction (`next`, not written).
        if let Err(e) = committed(&mut committing) {
            drop(tx);
            if !hung_up {
                fail(to_write, answers, e);
            }
            return;
        }
        committing = match tx.commit_later() {
            Ok(c) => Some(c),
            Err(_) if hung_up => return,
            Err(e) => return fail(to_write, answers, e),
        };
        // SQLite commits in process (nothing to overlap); the caller waits for a commit it
        // asked for.
        if asked || hung_up || checkpoints.is_some() {
            if let Err(e) = committed(&mut committing) {
                if !hung_up {
                    fail(to_write, answers, e);
                }
                return;
            }
            if (asked && !answer(Answer::Committed)) || hung_up {
                return;
            }
        }
    }
}

/// Answers what the thread was doing with the first failure; then every batch sent after it
/// as not written (and a commit asked for as done: the caller knows of the failure), until the
/// caller hangs up.
fn fail(to_write: &mpsc::Receiver<ToWrite>, answers: &mpsc::Sender<Answer>, error: StateError) {
    if answers.send(Answer::Failed(error)).is_err() {
        return;
    }
    while let Ok(what) = to_write.recv() {
        let sent = match what {
            ToWrite::Batch(batch) => answers.send(Answer::Skipped(batch)),
            ToWrite::Commit => answers.send(Answer::Committed),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// Writes `batch` in transaction `tx`: its operations, started and ended, their records, and
/// the bindings; the batch, to be freed by the caller.
fn write(tx: &mut Batch<'_>, mut batch: OwnedBatch) -> Result<OwnedBatch> {
    let deployment = batch.deployment;
    let ids = tx.begin_started(deployment, std::mem::take(&mut batch.starts))?;
    let entries: Vec<JournalEntry<'_>> = batch
        .puts
        .iter()
        .zip(ids)
        .map(|(put, operation)| JournalEntry::Put {
            operation,
            attempts: put.attempts,
            deployment,
            record: &put.record,
            outputs_changed: put.outputs_changed,
            new: put.new,
            manifests: put.manifests.as_ref(),
            sealed: put.sealed.as_ref(),
        })
        .collect();
    tx.journal(&entries)?;
    let (guresids, lists): (Vec<String>, Vec<_>) = std::mem::take(&mut batch.bindings)
        .into_iter()
        .map(|(guresid, bound, records)| (guresid, (bound, records)))
        .unzip();
    let bindings: Vec<(&str, bool, Vec<BindingRecord>)> = guresids
        .iter()
        .zip(lists)
        .map(|(guresid, (bound, records))| (guresid.as_str(), bound, records))
        .collect();
    tx.record_bindings(deployment, &batch.env, &bindings)?;
    drop(entries);
    // The batch's rows go now rather than with the commit: the server writes them while the
    // next batch is prepared.
    tx.send_gathered()?;
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::params;
    use crate::tests::{each_backend, record};

    fn put(guresid: &str, action: &'static str) -> (StartRow, EndedPut) {
        let start = StartRow {
            guresid: guresid.into(),
            app: Some("shop".into()),
            res_type: "postgres".into(),
            class: "default".into(),
            res_id: format!("{guresid}.db"),
            action,
            reason: "new".into(),
        };
        let put = EndedPut {
            attempts: 1,
            record: Box::new(record(guresid)),
            outputs_changed: Some(true),
            new: true,
            manifests: None,
            sealed: None,
        };
        (start, put)
    }

    fn batch(deployment: i64, puts: &[(&str, &'static str)]) -> OwnedBatch {
        let (starts, puts) = puts.iter().map(|(g, a)| put(g, a)).unzip();
        OwnedBatch {
            deployment,
            env: "development".into(),
            starts,
            puts,
            bindings: Vec::new(),
            spent: Box::new(()),
        }
    }

    /// `(guresid, status)` of the operations recorded, in id order, and the resources.
    fn journalled(store: &Store) -> (Vec<(String, String)>, Vec<String>) {
        let operations = store
            .conn
            .prepare_cached("SELECT guresid, status FROM operation ORDER BY id")
            .unwrap()
            .query_map(params![], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<crate::db::DbResult<Vec<_>>>()
            .unwrap();
        let resources = store
            .conn
            .prepare_cached("SELECT guresid FROM resource ORDER BY guresid")
            .unwrap()
            .query_map(params![], |r| r.get(0))
            .unwrap()
            .collect::<crate::db::DbResult<Vec<_>>>()
            .unwrap();
        (operations, resources)
    }

    fn ended(guresids: &[&str]) -> Vec<(String, String)> {
        guresids
            .iter()
            .map(|g| ((*g).to_owned(), "succeeded".to_owned()))
            .collect()
    }

    #[test]
    fn batches_are_written_in_the_order_sent_and_read_back_once_drained() {
        each_backend(|store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            writer
                .send(batch(dep, &[("g1", "create"), ("g2", "create")]))
                .unwrap();
            writer.send(batch(dep, &[("g3", "create")])).unwrap();
            writer.send(batch(dep, &[("g0", "create")])).unwrap();
            writer.drain().unwrap();
            let (operations, resources) = journalled(&store);
            assert_eq!(operations, ended(&["g1", "g2", "g3", "g0"]));
            assert_eq!(resources, ["g0", "g1", "g2", "g3"]);
            // The secrets are sealed with the store's own key.
            let read = store.resources("development").unwrap();
            let g3 = read.iter().find(|r| r.guresid == "g3").expect("g3");
            assert_eq!(g3.secret_outputs["password"], "s3cret");
        });
    }

    #[test]
    fn a_batch_that_updates_and_creates_ends_every_operation_in_the_order_started() {
        each_backend(|store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            writer
                .send(batch(dep, &[("g1", "create"), ("g2", "create")]))
                .unwrap();
            writer.drain().unwrap();
            // An update reads the version of its recorded row, so what the batch gathered
            // before it is written first: the operations started and not yet ended stay
            // gathered, and end with the rest.
            let mut mixed = batch(dep, &[("g3", "create"), ("g1", "update"), ("g4", "create")]);
            mixed.puts[1].new = false;
            writer.send(mixed).unwrap();
            writer.drain().unwrap();
            let (operations, resources) = journalled(&store);
            assert_eq!(operations, ended(&["g1", "g2", "g3", "g1", "g4"]));
            assert_eq!(resources, ["g1", "g2", "g3", "g4"]);
            let times: i64 = store
                .conn
                .query_row(
                    "SELECT COUNT(*) FROM operation
                     WHERE started_at IS NOT NULL AND finished_at IS NOT NULL",
                    params![],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(times, 5);
        });
    }

    #[test]
    fn a_batch_that_fails_is_told_and_those_sent_after_it_are_not_written() {
        each_backend(|store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            writer.send(batch(dep, &[("g1", "create")])).unwrap();
            // Drained: committed, whatever comes after.
            writer.drain().unwrap();
            writer.send(batch(dep, &[("g2", "create")])).unwrap();
            // The schema refuses the action: the whole transaction is rolled back, the batch
            // written before it in the same transaction with it.
            let refused = batch(dep, &[("g3", "create"), ("g4", "explode")]);
            writer.send(refused).unwrap();
            // Sent before or after the failure is known: either way it is not written.
            let after = writer.send(batch(dep, &[("g5", "create")]));
            let e = match after {
                Err(e) => e,
                Ok(()) => writer.drain().expect_err("the failed batch"),
            };
            assert!(e.to_string().contains("action"), "{e}");
            let again = writer.drain().expect_err("still failed").to_string();
            assert!(
                again.contains("an earlier batch was not written"),
                "{again}"
            );
            let (operations, resources) = journalled(&store);
            assert_eq!(operations, ended(&["g1"]));
            assert_eq!(resources, ["g1"]);
        });
    }

    #[test]
    fn a_drain_commits_the_batches_the_writer_holds_open() {
        each_backend(|store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            let count = |store: &Store| journalled(store).0.len();
            writer.send(batch(dep, &[("g1", "create")])).unwrap();
            writer.send(batch(dep, &[("g2", "create")])).unwrap();
            // The third batch is taken once the first two are committed together.
            writer.send(batch(dep, &[("g3", "create")])).unwrap();
            gitplane_testkit::eventually(
                "the first two batches committed",
                std::time::Duration::from_secs(10),
                || (count(&store) >= 2).then_some(()),
            );
            assert_eq!(journalled(&store).0, ended(&["g1", "g2"]));
            writer.drain().unwrap();
            assert_eq!(journalled(&store).0, ended(&["g1", "g2", "g3"]));
        });
    }

    #[test]
    fn the_log_of_the_writers_commits_is_copied_into_the_file_by_a_checkpoint_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let store = Store::open(&path).unwrap();
        let dep = store.begin_deployment("development", "c1").unwrap();
        // Whatever is in the log goes into the file now: in WAL mode only a checkpoint writes
        // the file, so it grows only if one copies the writer's commits.
        store.checkpoint().unwrap();
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        let mut writer = JournalWriter::start(&store).unwrap();
        for k in 0..COMMITS_PER_CHECKPOINT {
            let guresids: Vec<String> = (0..200).map(|i| format!("g{k}-{i}")).collect();
            let puts: Vec<(&str, &'static str)> =
                guresids.iter().map(|g| (g.as_str(), "create")).collect();
            writer.send(batch(dep, &puts)).unwrap();
            writer.drain().unwrap();
        }
        drop(writer);
        gitplane_testkit::eventually(
            "the commits copied into the file",
            std::time::Duration::from_secs(10),
            || (size() > before).then_some(()),
        );
        assert_eq!(journalled(&store).1.len(), 200 * COMMITS_PER_CHECKPOINT);
        // The store's own connection still checkpoints by itself.
        let own: i64 = store
            .conn
            .lite()
            .query_row("PRAGMA wal_autocheckpoint", [], |r| r.get(0))
            .unwrap();
        assert_eq!(own, 8_192);
        drop(store);
    }

    #[test]
    fn a_writer_dropped_writes_the_batches_sent_first() {
        each_backend(|store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            writer.send(batch(dep, &[("g1", "create")])).unwrap();
            writer.send(batch(dep, &[("g2", "create")])).unwrap();
            drop(writer);
            assert_eq!(journalled(&store).0, ended(&["g1", "g2"]));
        });
    }
}
