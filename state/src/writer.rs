//! Batches of the journal written on a connection of their own, in order, while the caller
//! prepares the next: a first apply's in-process answers, tens of thousands of rows, cost the
//! apply the time of its slowest side rather than of both.
//!
//! Only batches whose operations have no effect outside gitplane go here (a driver that answers
//! in process): whatever the caller does before such a batch is committed is redone by the next
//! run should the process stop. Before anything with an effect outside (a driver call) or any
//! other write, the caller waits for every batch sent ([`JournalWriter::drain`]), so the
//! journal's order and "journalled before it is acted on" hold as they do with one connection.

use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::db::DbError;
use crate::{
    BindingRecord, JournalEntry, ManifestsRecord, OperationStart, ResourceRecord, Result,
    StateError, Store,
};

/// An operation of a batch, as [`OperationStart`] says it, owned.
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

/// How the writer's thread answered one batch.
enum Answer {
    Committed(OwnedBatch),
    Failed(StateError),
    /// An earlier batch failed: this one was not written, so the journal keeps its order.
    Skipped(OwnedBatch),
}

/// Writes [`OwnedBatch`]es in the order sent, each in one transaction, on its own connection
/// and thread. One batch is written at a time, and the caller hands over the next only once the
/// writer takes it: what waits in memory is bounded by two batches.
pub struct JournalWriter {
    batches: Option<mpsc::SyncSender<OwnedBatch>>,
    written: mpsc::Receiver<Answer>,
    /// Batches sent whose answer has not been read.
    in_flight: usize,
    /// A batch failed: nothing sent after it is written, and every call says so.
    failed: bool,
    thread: Option<JoinHandle<()>>,
    path: std::path::PathBuf,
}

impl JournalWriter {
    /// Starts a writer on another connection to `store`'s state (its key and fences).
    pub fn start(store: &Store) -> Result<JournalWriter> {
        let mut own = store.connect_again()?;
        let (batches, to_write) = mpsc::sync_channel::<OwnedBatch>(0);
        let (answers, written) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || {
                let mut failed = false;
                for batch in to_write {
                    let answer = if failed {
                        Answer::Skipped(batch)
                    } else {
                        match write(&mut own, batch) {
                            Ok(batch) => Answer::Committed(batch),
                            Err(e) => {
                                failed = true;
                                Answer::Failed(e)
                            }
                        }
                    };
                    if answers.send(answer).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| stopped(store.path(), &e.to_string()))?;
        Ok(JournalWriter {
            batches: Some(batches),
            written,
            in_flight: 0,
            failed: false,
            thread: Some(thread),
            path: store.path().to_owned(),
        })
    }

    /// Sends `batch` to be written after those sent before. Returns the error of an earlier
    /// batch, if one failed (this one is then not written).
    pub fn send(&mut self, batch: OwnedBatch) -> Result<()> {
        self.answered(false)?;
        let sent = self.batches.as_ref().map(|b| b.send(batch));
        match sent {
            Some(Ok(())) => {
                self.in_flight += 1;
                Ok(())
            }
            _ => Err(self.thread_ended()),
        }
    }

    /// Waits until every batch sent is committed; the first error, if one failed.
    pub fn drain(&mut self) -> Result<()> {
        self.answered(true)
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
                Answer::Committed(batch) | Answer::Skipped(batch) => drop(batch),
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
    /// Lets the batches sent be written, then ends the thread.
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

/// Writes `batch` in one transaction: its operations, started and ended, their records, and
/// the bindings; the batch, to be freed by the caller.
fn write(store: &mut Store, mut batch: OwnedBatch) -> Result<OwnedBatch> {
    let deployment = batch.deployment;
    let starts: Vec<OperationStart<'_>> = batch
        .starts
        .iter()
        .map(|s| OperationStart {
            deployment,
            guresid: &s.guresid,
            app: s.app.as_deref(),
            res_type: &s.res_type,
            class: &s.class,
            res_id: &s.res_id,
            action: s.action,
            reason: &s.reason,
        })
        .collect();
    let mut tx = store.batch()?;
    let ids = tx.begin_operations(&starts)?;
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
    tx.commit()?;
    drop(entries);
    drop(starts);
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
    fn a_batch_that_fails_is_told_and_those_sent_after_it_are_not_written() {
        each_backend(|store| {
            let dep = store.begin_deployment("development", "c1").unwrap();
            let mut writer = JournalWriter::start(&store).unwrap();
            writer.send(batch(dep, &[("g1", "create")])).unwrap();
            // The schema refuses the action: the whole batch is rolled back.
            let refused = batch(dep, &[("g2", "create"), ("g3", "explode")]);
            writer.send(refused).unwrap();
            // Sent before or after the failure is known: either way it is not written.
            let after = writer.send(batch(dep, &[("g4", "create")]));
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
