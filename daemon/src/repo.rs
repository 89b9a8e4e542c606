//! Reading a commit of the config repository straight from git's object database, no checkout.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use gix::bstr::{BStr, ByteSlice};
use gix::objs::{Exists, Find, FindExt};
use rayon::prelude::*;

/// The files of one commit that gitplane reads, by repository path.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The full commit id (40 hex characters).
    pub commit: String,
    pub files: Files,
}

/// The contents of the files gitplane reads (what it dereferences to), and the symbolic links
/// found among them, which the loader reports rather than skipping in silence.
#[derive(Debug, Clone, Default)]
pub struct Files {
    contents: BTreeMap<String, Vec<u8>>,
    links: BTreeMap<String, String>,
}

impl std::ops::Deref for Files {
    type Target = BTreeMap<String, Vec<u8>>;

    fn deref(&self) -> &Self::Target {
        &self.contents
    }
}

impl crate::model::Sources for Files {
    fn contents(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.contents
    }

    fn links(&self) -> &BTreeMap<String, String> {
        &self.links
    }
}

/// What a commit's trees say, without reading a file: the object id (hex) of each app's folder
/// under `workloads/`, and of everything else a graph is made of. Two commits with equal ids
/// here have equal files there, so an app whose folder's id did not change did not change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub commit: String,
    /// App id (its folder under `workloads/`) to the folder's tree id.
    pub apps: BTreeMap<String, String>,
    /// `gitplane.yaml`, each `environments/` file, the `definitions/` folder (as
    /// `definitions/`, its tree id) and any file directly under `workloads/`, to their ids.
    pub shared: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("{path}: not a git repository (or none above it): {message}")]
    Open { path: PathBuf, message: String },
    #[error(
        "{path}: cannot open the repository: the process is out of file descriptors ({source}); \
         raise the open files limit (LimitNOFILE= in the systemd unit, ulimit -n) or find what \
         holds them (ls /proc/<pid>/fd)"
    )]
    OutOfFiles {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: cannot resolve revision '{rev}': {message}")]
    Revision {
        path: PathBuf,
        rev: String,
        message: String,
    },
    #[error("{path}: the repository has no commits yet (HEAD is unborn): commit something first")]
    Unborn { path: PathBuf },
    #[error("{path}: cannot read commit {commit}: {message}")]
    Read {
        path: PathBuf,
        commit: String,
        message: String,
    },
}

/// The folders and files of the repository format (docs/repository.md, section 1).
fn wanted(path: &str) -> bool {
    path == "gitplane.yaml"
        || path == "gitplane.yml"
        || path.starts_with("environments/")
        || path.starts_with("workloads/")
        || path.starts_with("definitions/")
}

/// Whether a file under the folder `dir` (no trailing slash) can be [`wanted`].
fn wanted_dir(dir: &str) -> bool {
    ["environments", "workloads", "definitions"]
        .iter()
        .any(|top| dir == *top || dir.strip_prefix(top).is_some_and(|r| r.starts_with('/')))
}

/// Why `path` did not open as a repository. gix reports any failure to read it as "not a
/// repository"; when the process has no file descriptor left (EMFILE, or ENFILE for the whole
/// system) that is said instead, since the repository is fine and the fix is elsewhere.
pub(crate) fn open_error(path: &Path, error: &(dyn std::error::Error + 'static)) -> RepoError {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    let exhausted = |e: &std::io::Error| matches!(e.raw_os_error(), Some(EMFILE | ENFILE));
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && exhausted(io)
        {
            return RepoError::OutOfFiles {
                path: path.to_owned(),
                source: std::io::Error::from_raw_os_error(io.raw_os_error().unwrap_or(EMFILE)),
            };
        }
        cause = e.source();
    }
    // gix may keep only the message of what failed: ask the file system itself.
    if let Err(io) = std::fs::File::open(path)
        && exhausted(&io)
    {
        return RepoError::OutOfFiles {
            path: path.to_owned(),
            source: io,
        };
    }
    RepoError::Open {
        path: path.to_owned(),
        message: error.to_string(),
    }
}

/// The entries of tree `tree`.
fn tree_entries(
    objects: &impl Find,
    tree: &gix::oid,
    buf: &mut Vec<u8>,
) -> Result<Vec<RootEntry>, String> {
    objects
        .find_tree_iter(tree, buf)
        .and_then(|t| t.collect::<Result<Vec<_>, _>>())
        .map(|entries| {
            entries
                .into_iter()
                .map(|e| {
                    (
                        e.filename.to_str_lossy().into_owned(),
                        e.mode,
                        e.oid.to_owned(),
                    )
                })
                .collect()
        })
        .map_err(|e| e.to_string())
}

/// What a snapshot reads of a tree's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Wanted {
    /// A folder that may hold a wanted file: its entries.
    Folder,
    File,
    /// A symbolic link: the path it names.
    Link,
}

/// An object as a snapshot read it.
enum Read {
    Folder(Vec<RootEntry>),
    Blob(Vec<u8>),
    Link(String),
}

/// The path of entry `(name, mode, oid)` of folder `dir` ("" for the root), what a snapshot of
/// `apps` (every app when `None`) reads of it, and its object; `None` when nothing.
fn wanted_entry(
    apps: Option<&BTreeSet<String>>,
    dir: &str,
    (name, mode, oid): RootEntry,
) -> Option<(String, Wanted, gix::ObjectId)> {
    let skipped = mode.is_tree()
        && match apps {
            None => false,
            Some(apps) if dir == "workloads" => !apps.contains(&name),
            Some(apps) => dir.is_empty() && name == "definitions" && apps.is_empty(),
        };
    let path = if dir.is_empty() {
        name
    } else {
        format!("{dir}/{name}")
    };
    let what = if mode.is_tree() {
        (wanted_dir(&path) && !skipped).then_some(Wanted::Folder)
    } else if mode.is_blob() {
        wanted(&path).then_some(Wanted::File)
    } else if mode.is_link() {
        (wanted(&path) || wanted_dir(&path)).then_some(Wanted::Link)
    } else {
        None
    };
    what.map(|what| (path, what, oid))
}

/// Reads object `oid` as `what`.
fn read_object(objects: &Objects<'_>, oid: &gix::oid, what: Wanted) -> Result<Read, String> {
    let mut buf = Vec::new();
    match what {
        Wanted::Folder => tree_entries(objects, oid, &mut buf).map(Read::Folder),
        Wanted::File => objects
            .find_blob(oid, &mut buf)
            .map(|blob| Read::Blob(blob.data.to_vec()))
            .map_err(|e| e.to_string()),
        // A link's blob is the path it names.
        Wanted::Link => objects
            .find_blob(oid, &mut buf)
            .map(|blob| Read::Link(blob.data.to_str_lossy().into_owned()))
            .map_err(|e| e.to_string()),
    }
}

/// A branch's merge into the watched ref, as [`ConfigRepo::merge_into`] made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merge {
    /// The commit of the merge result, in the handle's memory only.
    pub commit: String,
    /// The merge base: the newest commit both have.
    pub base: String,
    /// How many commits the watched ref has that the branch lacks.
    pub behind: usize,
    /// The paths both sides changed since the merge base, differently, by path.
    pub conflicts: Vec<String>,
}

/// A config repository, bare or not, opened isolated from the user's git configuration.
pub struct ConfigRepo {
    repo: gix::Repository,
    path: PathBuf,
    /// Object databases searched before the repository's own: git's quarantine and the alternates
    /// git names in the environment, when opened with [`ConfigRepo::open_in_hook`]; else none.
    extra: Vec<gix::odb::Handle>,
    /// Files every commit read through this handle has in addition to (or instead of) its
    /// own: a preview environment's file, which no commit holds.
    overlay: BTreeMap<String, Vec<u8>>,
    /// The commit everything but `workloads/` is read from, whatever commit is asked for: a
    /// preview runs its branch's workloads with the watched ref's platform (see
    /// [`ConfigRepo::with_platform`]).
    platform: Option<gix::ObjectId>,
}

/// A root tree's entry: its name, whether it is a tree, and its object id.
type RootEntry = (String, gix::objs::tree::EntryMode, gix::ObjectId);

/// The objects of a [`ConfigRepo`]: its extra object databases, then its own.
struct Objects<'r> {
    own: &'r gix::OdbHandle,
    extra: &'r [gix::odb::Handle],
}

impl Find for Objects<'_> {
    fn try_find<'a>(
        &self,
        id: &gix::oid,
        buffer: &'a mut Vec<u8>,
    ) -> gix::Result<Option<gix::objs::Data<'a>>> {
        // Ask `exists` first: returning the first hit of a loop over `try_find` would keep
        // `buffer` borrowed for the next round.
        match self.extra.iter().find(|db| db.exists(id)) {
            Some(db) => db.try_find(id, buffer),
            None => self.own.try_find(id, buffer),
        }
    }
}

/// The object directories git names in the environment of a hook it runs: `GIT_OBJECT_DIRECTORY`
/// (during pre-receive, the quarantine that holds the pushed objects; `GIT_QUARANTINE_PATH` names
/// the same folder) and every entry of `GIT_ALTERNATE_OBJECT_DIRECTORIES` (`:`-separated, an
/// entry that contains `:` or starts with `"` is C-quoted, as git writes it).
fn env_object_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("GIT_OBJECT_DIRECTORY")
        .or_else(|| std::env::var_os("GIT_QUARANTINE_PATH"))
        .filter(|d| !d.is_empty())
    {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(list) = std::env::var_os("GIT_ALTERNATE_OBJECT_DIRECTORIES") {
        dirs.extend(split_alternates(&list));
    }
    dirs
}

/// Splits `GIT_ALTERNATE_OBJECT_DIRECTORIES` like git's `parse_alt_odb_entry`.
fn split_alternates(list: &OsStr) -> Vec<PathBuf> {
    let Some(bytes) = gix::path::os_str_into_bstr(list).ok() else {
        return Vec::new();
    };
    let mut rest: &BStr = bytes;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (entry, consumed) = match rest
            .starts_with(b"\"")
            .then(|| gix::quote::ansi_c::undo(rest))
        {
            Some(Ok((unquoted, consumed))) => (unquoted.into_owned(), consumed),
            _ => {
                let end = rest.find_byte(b':').unwrap_or(rest.len());
                (rest[..end].to_owned(), end)
            }
        };
        rest = rest[consumed..].as_bstr();
        if rest.first() == Some(&b':') {
            rest = rest[1..].as_bstr();
        }
        if !entry.is_empty()
            && let Ok(path) = gix::path::from_bstring(entry)
        {
            out.push(path);
        }
    }
    out
}

/// Who made a commit and what it says, as people read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub author: String,
    /// The message's first line.
    pub summary: String,
    /// When it was authored, in seconds since the epoch.
    pub time: i64,
}

impl ConfigRepo {
    /// Opens the repository at `path`, or the one that contains it.
    pub fn open(path: &Path) -> Result<Self, RepoError> {
        let repo = gix::discover_opts(path, Default::default(), gix::open::Options::isolated())
            .map_err(|e| open_error(path, &e))?;
        Ok(ConfigRepo {
            repo,
            path: path.to_owned(),
            extra: Vec::new(),
            overlay: BTreeMap::new(),
            platform: None,
        })
    }

    /// Opens the repository at `path` as [`ConfigRepo::open`] does, for a git hook: objects are
    /// also read from the object directories git names in the environment.
    ///
    /// During `pre-receive`, git keeps the pushed objects in a quarantine folder until the hook
    /// accepts them, and tells the hook where through `GIT_OBJECT_DIRECTORY` (the quarantine) and
    /// `GIT_ALTERNATE_OBJECT_DIRECTORIES` (the real object database). gix 0.90 reads neither:
    /// [`gix::open::permissions::Environment::objects`] only gates object-related settings, and
    /// the object store is always `<git dir>/objects` plus its `info/alternates` file. So the
    /// repository is still opened isolated (no user or system git config, no `GIT_*` variables),
    /// and each named folder is opened as an extra gix object store that lookups try first. This
    /// reads packs and loose objects in place (a push of more than `receive.unpackLimit` objects
    /// stays a pack in the quarantine), writes nothing, and needs neither the `git` program nor a
    /// copy of the pushed objects. Outside a hook, no such variable is set and this is `open`.
    pub fn open_in_hook(path: &Path) -> Result<Self, RepoError> {
        let mut this = Self::open(path)?;
        let own = std::fs::canonicalize(this.repo.common_dir().join("objects")).ok();
        for dir in env_object_dirs() {
            if own.is_some() && std::fs::canonicalize(&dir).ok() == own {
                continue;
            }
            let db = gix::odb::at(&dir, this.repo.object_hash()).map_err(|e| RepoError::Open {
                path: path.to_owned(),
                message: format!("object directory {}: {e}", dir.display()),
            })?;
            this.extra.push(db);
        }
        Ok(this)
    }

    fn objects(&self) -> Objects<'_> {
        Objects {
            own: &self.repo.objects,
            extra: &self.extra,
        }
    }

    /// The full name of the branch HEAD points to (`refs/heads/main`), if HEAD is symbolic.
    pub fn head_ref(&self) -> Option<String> {
        self.repo
            .head_name()
            .ok()
            .flatten()
            .map(|name| name.as_bstr().to_string())
    }

    /// Resolves `rev` (a branch, tag or commit id; `None` is HEAD) to a full commit id.
    pub fn resolve(&self, rev: Option<&str>) -> Result<String, RepoError> {
        if let Some(resolved) = rev.and_then(|rev| self.resolve_extra(rev)) {
            return resolved;
        }
        let id = match rev {
            None => {
                let head = self.repo.head_id().map_err(|_| RepoError::Unborn {
                    path: self.path.clone(),
                })?;
                head.detach()
            }
            Some(rev) => self
                .repo
                .rev_parse_single(rev)
                .map_err(|_| RepoError::Revision {
                    path: self.path.clone(),
                    rev: rev.to_owned(),
                    message: self.why_unresolved(rev),
                })?
                .detach(),
        };
        let object = self.repo.find_object(id).map_err(|e| RepoError::Revision {
            path: self.path.clone(),
            rev: rev.unwrap_or("HEAD").to_owned(),
            message: format!("its object cannot be read ({e})"),
        })?;
        let kind = object.kind;
        let commit = object.peel_to_commit().map_err(|_| RepoError::Revision {
            path: self.path.clone(),
            rev: rev.unwrap_or("HEAD").to_owned(),
            message: format!(
                "it names a {kind}, not a commit: give a branch, a tag or a commit id"
            ),
        })?;
        Ok(commit.id.to_string())
    }

    /// Why `rev` does not resolve, in the terms of `--rev` rather than gix's parser: the
    /// parser's own message names its delegates and internal states.
    fn why_unresolved(&self, rev: &str) -> String {
        const WHAT: &str = "give a branch (main), a tag, or a commit id (at least 4 hex digits)";
        if rev.trim().is_empty() {
            return format!("the revision is empty: {WHAT}");
        }
        if rev.contains("..") {
            return format!("'{rev}' is a range of commits; gitplane needs one commit: {WHAT}");
        }
        // `main~3`, `v1^2`: when the name before the steps resolves, the steps go too far.
        if let Some(at) = rev.find(['~', '^', '@', ':'])
            && at > 0
            && self.repo.rev_parse_single(&rev[..at]).is_ok()
        {
            return format!(
                "'{}' exists, but '{}' does not lead to a commit from it (the history may be \
                 shorter than that): {WHAT}",
                &rev[..at],
                &rev[at..]
            );
        }
        format!("no branch, tag or commit is named '{rev}': {WHAT}")
    }

    /// `rev` peeled to a commit when it is the full id of an object of an extra object database
    /// (a commit still in git's quarantine, which `rev_parse` cannot see); `None` otherwise.
    fn resolve_extra(&self, rev: &str) -> Option<Result<String, RepoError>> {
        let mut id = gix::ObjectId::from_hex(rev.as_bytes()).ok()?;
        if !self.extra.iter().any(|db| db.exists(&id)) {
            return None;
        }
        let objects = self.objects();
        let mut buf = Vec::new();
        let peeled = loop {
            let data = match objects.try_find(&id, &mut buf) {
                Ok(Some(data)) => data,
                Ok(None) => break Err(format!("object {id} not found")),
                Err(e) => break Err(e.to_string()),
            };
            match data.kind {
                gix::objs::Kind::Commit => break Ok(id.to_string()),
                gix::objs::Kind::Tag => match data.try_into_tag_iter().map(|t| t.target_id()) {
                    Some(Ok(target)) => id = target,
                    Some(Err(e)) => break Err(e.to_string()),
                    None => break Err(format!("{id}: not a tag")),
                },
                kind => break Err(format!("{id} is a {kind}, not a commit")),
            }
        };
        Some(peeled.map_err(|message| RepoError::Revision {
            path: self.path.clone(),
            rev: rev.to_owned(),
            message,
        }))
    }

    /// Reads every file of the repository format at `commit`.
    pub fn snapshot(&self, commit: &str) -> Result<Snapshot, RepoError> {
        self.snapshot_of(commit, None)
    }

    /// Reads the files of the repository format at `commit` that building `apps` needs: with
    /// `None`, every one; else the settings, the environments, the folders of `apps` under
    /// `workloads/`, and the definitions unless `apps` is empty.
    pub fn snapshot_of(
        &self,
        commit: &str,
        apps: Option<&BTreeSet<String>>,
    ) -> Result<Snapshot, RepoError> {
        let _span = tracing::debug_span!("read files").entered();
        let read_err = self.read_err(commit);
        // A level of the tree at a time, every object of the level on the cores there are: a
        // first apply reads tens of thousands of folders and files. Each distinct object is
        // read once: apps made from one template share their files, and so their folders.
        // gix's handles are `Send` but not `Sync`, so each of rayon's jobs reads through
        // clones of its own.
        let handles = std::sync::Mutex::new((self.repo.objects.clone(), self.extra.clone()));
        let mut files = BTreeMap::new();
        let mut links = BTreeMap::new();
        let mut level: Vec<(String, RootEntry)> = self
            .root_entries(commit)?
            .into_iter()
            .map(|entry| (String::new(), entry))
            .collect();
        while !level.is_empty() {
            let wanted: Vec<(String, Wanted, gix::ObjectId)> = level
                .into_iter()
                .filter_map(|(dir, entry)| wanted_entry(apps, &dir, entry))
                .collect();
            let mut distinct: Vec<(gix::ObjectId, Wanted)> =
                wanted.iter().map(|(_, what, oid)| (*oid, *what)).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let read: HashMap<(gix::ObjectId, Wanted), Result<Read, String>> = distinct
                .into_par_iter()
                .map_init(
                    || {
                        handles
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .clone()
                    },
                    |(own, extra), (oid, what)| {
                        let objects = Objects { own, extra };
                        ((oid, what), read_object(&objects, &oid, what))
                    },
                )
                .collect();
            level = Vec::new();
            for (path, what, oid) in wanted {
                let found = match &read[&(oid, what)] {
                    Ok(found) => found,
                    Err(e) if what == Wanted::Folder => {
                        return Err(read_err(format!("{path}/: {e}")));
                    }
                    Err(e) => return Err(read_err(format!("{path}: {e}"))),
                };
                match found {
                    Read::Folder(entries) => {
                        level.extend(entries.iter().map(|e| (path.clone(), e.clone())));
                    }
                    Read::Blob(contents) => {
                        files.insert(path, contents.clone());
                    }
                    Read::Link(target) => {
                        links.insert(path, target.clone());
                    }
                }
            }
        }
        for (path, contents) in &self.overlay {
            files.insert(path.clone(), contents.clone());
        }
        Ok(Snapshot {
            commit: commit.to_owned(),
            files: Files {
                contents: files,
                links,
            },
        })
    }

    /// The object ids `commit`'s graphs are made of, from its trees alone (no file is read):
    /// each app's folder under `workloads/`, and everything else gitplane reads.
    pub fn layout(&self, commit: &str) -> Result<Layout, RepoError> {
        let read_err = self.read_err(commit);
        let objects = self.objects();
        let mut tree_buf = Vec::new();
        let mut entries_of = |tree: &gix::oid, dir: &str| {
            objects
                .find_tree_iter(tree, &mut tree_buf)
                .and_then(|t| t.collect::<Result<Vec<_>, _>>())
                .map(|entries| {
                    entries
                        .into_iter()
                        .map(|e| {
                            (
                                e.filename.to_str_lossy().into_owned(),
                                e.mode.is_tree(),
                                e.oid.to_owned(),
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .map_err(|e| read_err(format!("{dir}/: {e}")))
        };
        let mut layout = Layout {
            commit: commit.to_owned(),
            apps: BTreeMap::new(),
            shared: BTreeMap::new(),
        };
        for (name, mode, oid) in self.root_entries(commit)? {
            match (name.as_str(), mode.is_tree()) {
                ("definitions", true) => {
                    layout
                        .shared
                        .insert("definitions/".to_owned(), oid.to_string());
                }
                ("environments", true) => {
                    for (file, _, oid) in entries_of(&oid, "environments")? {
                        layout
                            .shared
                            .insert(format!("environments/{file}"), oid.to_string());
                    }
                }
                ("workloads", true) => {
                    for (entry, is_tree, oid) in entries_of(&oid, "workloads")? {
                        if is_tree {
                            layout.apps.insert(entry, oid.to_string());
                        } else {
                            // A file directly under workloads/ is misplaced: every load reads it.
                            layout
                                .shared
                                .insert(format!("workloads/{entry}"), oid.to_string());
                        }
                    }
                }
                (file, false) if wanted(file) => {
                    layout.shared.insert(file.to_owned(), oid.to_string());
                }
                _ => {}
            }
        }
        for (path, contents) in &self.overlay {
            use sha2::Digest;
            let id = sha2::Sha256::digest(contents);
            let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
            layout.shared.insert(path.clone(), format!("overlay:{id}"));
        }
        Ok(layout)
    }

    /// This handle with `path` holding `contents` in every commit it reads (see `overlay`).
    pub fn with_file(mut self, path: &str, contents: &[u8]) -> Self {
        self.overlay.insert(path.to_owned(), contents.to_vec());
        self
    }

    /// This handle reading only `workloads/` from the commits it is asked for, and everything
    /// else (`gitplane.yaml`, `environments/`, `definitions/`) from `platform`.
    pub fn with_platform(mut self, platform: &str) -> Result<Self, RepoError> {
        let id = gix::ObjectId::from_hex(platform.as_bytes())
            .map_err(|e| self.read_err(platform)(e.to_string()))?;
        self.platform = Some(id);
        Ok(self)
    }

    /// The entries of `commit`'s root tree, with everything but `workloads` taken from the
    /// platform commit when there is one.
    fn root_entries(&self, commit: &str) -> Result<Vec<RootEntry>, RepoError> {
        let own = self.entries_of_root(commit)?;
        let Some(platform) = self.platform else {
            return Ok(own);
        };
        let platform = platform.to_string();
        let mut entries: Vec<RootEntry> = self
            .entries_of_root(&platform)?
            .into_iter()
            .filter(|(name, _, _)| name != "workloads")
            .collect();
        entries.extend(own.into_iter().filter(|(name, _, _)| name == "workloads"));
        Ok(entries)
    }

    fn entries_of_root(&self, commit: &str) -> Result<Vec<RootEntry>, RepoError> {
        let tree = self.root_tree(commit)?;
        tree_entries(&self.objects(), &tree, &mut Vec::new())
            .map_err(|e| self.read_err(commit)(format!("/: {e}")))
    }

    /// The common ancestor of `a` and `b` that git's `merge-base` gives; `None` when their
    /// histories never meet.
    pub fn merge_base(&self, a: &str, b: &str) -> Result<Option<String>, RepoError> {
        let id = |c: &str| {
            gix::ObjectId::from_hex(c.as_bytes()).map_err(|e| self.read_err(c)(e.to_string()))
        };
        self.repo
            .merge_base(id(a)?, id(b)?)
            .map(|base| base.map(|id| id.to_string()))
            .map_err(|e| self.read_err(a)(format!("merge base with {b}: {e}")))
    }

    /// What merging `theirs` (a branch) into `ours` (the watched ref) would give, when `ours` has
    /// commits `theirs` lacks: a commit of the merge result, made in this handle's memory only
    /// (the repository is not written), that every read through this handle sees. `None` when
    /// `theirs` already holds `ours` (or their histories never meet): `theirs` is its own merge
    /// result.
    ///
    /// The merge is git's three-way merge at the level of files: a path only one side changed
    /// since the merge base takes that side's version; a path both changed differently is a
    /// conflict, listed and left as `ours` has it.
    pub fn merge_into(
        mut self,
        ours: &str,
        theirs: &str,
    ) -> Result<(Self, Option<Merge>), RepoError> {
        let Some(base) = self.merge_base(ours, theirs)? else {
            return Ok((self, None));
        };
        if base == ours {
            return Ok((self, None));
        }
        let read_err = |c: &str, message: String| RepoError::Read {
            path: self.path.clone(),
            commit: c.to_owned(),
            message,
        };
        let id =
            |c: &str| gix::ObjectId::from_hex(c.as_bytes()).map_err(|e| read_err(c, e.to_string()));
        let (ours_id, theirs_id) = (id(ours)?, id(theirs)?);
        let behind = self
            .repo
            .rev_walk([ours_id])
            .with_hidden([theirs_id])
            .all()
            .map_err(|e| read_err(ours, format!("commits since {base}: {e}")))?
            .count();
        self.repo = self.repo.with_object_memory();
        let trees = [
            self.root_tree(&base)?,
            self.root_tree(ours)?,
            self.root_tree(theirs)?,
        ];
        let mut conflicts = Vec::new();
        let tree = self
            .merge_trees("", trees.map(Some), &mut conflicts)
            .map_err(|e| read_err(theirs, format!("merging into {ours}: {e}")))?
            .unwrap_or(trees[1]);
        let signature = gix::actor::Signature {
            name: "gitplane".into(),
            email: "gitplane@localhost".into(),
            time: gix::date::Time::default(),
        };
        let commit = gix::objs::Commit {
            tree,
            parents: [ours_id, theirs_id].into_iter().collect(),
            author: signature.clone(),
            committer: signature,
            encoding: None,
            message: format!("The merge of {theirs} into {ours}, planned\n").into(),
            extra_headers: Vec::new(),
        };
        let commit = self
            .repo
            .write_object(&commit)
            .map_err(|e| read_err(theirs, format!("merging into {ours}: {e}")))?
            .to_string();
        Ok((
            self,
            Some(Merge {
                commit,
                base,
                behind,
                conflicts,
            }),
        ))
    }

    /// The three-way merge of the trees `[base, ours, theirs]` (`None`: not there) at `dir`:
    /// the merged tree, written to memory, or `None` when the path goes. A conflict's path is
    /// pushed to `conflicts` and `ours` kept.
    fn merge_trees(
        &self,
        dir: &str,
        [base, ours, theirs]: [Option<gix::ObjectId>; 3],
        conflicts: &mut Vec<String>,
    ) -> Result<Option<gix::ObjectId>, String> {
        type Side = Option<(gix::objs::tree::EntryMode, gix::ObjectId)>;
        let objects = self.objects();
        let mut buf = Vec::new();
        let mut entries_of = |tree: Option<gix::ObjectId>| -> Result<
            BTreeMap<String, (gix::objs::tree::EntryMode, gix::ObjectId)>,
            String,
        > {
            Ok(match tree {
                Some(t) => tree_entries(&objects, &t, &mut buf)?
                    .into_iter()
                    .map(|(n, m, o)| (n, (m, o)))
                    .collect(),
                None => BTreeMap::new(),
            })
        };
        let (b, o, t) = (entries_of(base)?, entries_of(ours)?, entries_of(theirs)?);
        let names: BTreeSet<&String> = b.keys().chain(o.keys()).chain(t.keys()).collect();
        let mut merged = gix::objs::Tree::empty();
        for name in names {
            let (eb, eo, et): (Side, Side, Side) = (
                b.get(name).copied(),
                o.get(name).copied(),
                t.get(name).copied(),
            );
            let path = if dir.is_empty() {
                name.clone()
            } else {
                format!("{dir}/{name}")
            };
            let tree_or_none = |e: Side| e.is_none_or(|(m, _)| m.is_tree());
            let chosen: Side = if et == eb || eo == et {
                eo
            } else if eo == eb {
                et
            } else if tree_or_none(eb) && tree_or_none(eo) && tree_or_none(et) {
                let oid = |e: Side| e.map(|(_, o)| o);
                self.merge_trees(&path, [oid(eb), oid(eo), oid(et)], conflicts)?
                    .map(|id| {
                        (
                            gix::objs::tree::EntryMode::from(gix::objs::tree::EntryKind::Tree),
                            id,
                        )
                    })
            } else {
                conflicts.push(path);
                eo
            };
            if let Some((mode, oid)) = chosen {
                merged.entries.push(gix::objs::tree::Entry {
                    mode,
                    filename: name.as_str().into(),
                    oid,
                });
            }
        }
        if merged.entries.is_empty() {
            return Ok(None);
        }
        merged.entries.sort();
        self.repo
            .write_object(&merged)
            .map(|id| Some(id.detach()))
            .map_err(|e| format!("{dir}/: {e}"))
    }

    /// The paths outside `workloads/` whose contents differ between commits `from` and `to`
    /// (at most `limit`, files by their full path, in path order); empty when only
    /// `workloads/` changed. Only trees that differ are read.
    pub fn changed_outside_workloads(
        &self,
        from: &str,
        to: &str,
        limit: usize,
    ) -> Result<Vec<String>, RepoError> {
        let (old, new) = (self.entries_of_root(from)?, self.entries_of_root(to)?);
        let mut changed = Vec::new();
        let mut buf = Vec::new();
        self.diff_entries("", old, new, limit, &mut changed, &mut buf)
            .map_err(|e| self.read_err(to)(e))?;
        changed.sort();
        Ok(changed)
    }

    fn diff_entries(
        &self,
        dir: &str,
        old: Vec<RootEntry>,
        new: Vec<RootEntry>,
        limit: usize,
        changed: &mut Vec<String>,
        buf: &mut Vec<u8>,
    ) -> Result<(), String> {
        let old: BTreeMap<String, (gix::objs::tree::EntryMode, gix::ObjectId)> =
            old.into_iter().map(|(n, m, o)| (n, (m, o))).collect();
        let new: BTreeMap<String, (gix::objs::tree::EntryMode, gix::ObjectId)> =
            new.into_iter().map(|(n, m, o)| (n, (m, o))).collect();
        let names: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
        for name in names {
            if changed.len() >= limit {
                return Ok(());
            }
            if dir.is_empty() && name == "workloads" {
                continue;
            }
            let path = if dir.is_empty() {
                name.clone()
            } else {
                format!("{dir}/{name}")
            };
            let (a, b) = (old.get(name), new.get(name));
            if a == b {
                continue;
            }
            let objects = self.objects();
            let children = |side: Option<&(gix::objs::tree::EntryMode, gix::ObjectId)>,
                            buf: &mut Vec<u8>| match side {
                Some((mode, oid)) if mode.is_tree() => {
                    tree_entries(&objects, oid, buf).map_err(|e| format!("{path}/: {e}"))
                }
                _ => Ok(Vec::new()),
            };
            // A folder on both sides (or on one, the other missing) is compared file by file.
            let folder = |side: Option<&(gix::objs::tree::EntryMode, gix::ObjectId)>| {
                side.is_none_or(|(mode, _)| mode.is_tree())
            };
            if folder(a) && folder(b) {
                let (ca, cb) = (children(a, buf)?, children(b, buf)?);
                self.diff_entries(&path, ca, cb, limit, changed, buf)?;
            } else {
                changed.push(path);
            }
        }
        Ok(())
    }

    /// The branches (`refs/heads/...`) and the commit each points at, by name. A branch that
    /// does not point at a commit is left out.
    pub fn branches(&self) -> Result<Vec<(String, String)>, RepoError> {
        let err = |message: String| RepoError::Open {
            path: self.path.clone(),
            message,
        };
        let platform = self.repo.references().map_err(|e| err(e.to_string()))?;
        let mut branches = Vec::new();
        for reference in platform
            .prefixed("refs/heads/")
            .map_err(|e| err(e.to_string()))?
        {
            let Ok(mut reference) = reference else {
                continue;
            };
            let name = reference.name().as_bstr().to_string();
            let Ok(id) = reference.peel_to_id() else {
                continue;
            };
            let is_commit = self
                .repo
                .find_object(id.detach())
                .is_ok_and(|o| o.kind == gix::objs::Kind::Commit);
            if is_commit {
                branches.push((name, id.to_string()));
            }
        }
        branches.sort();
        Ok(branches)
    }

    /// How a failure to read `commit`'s objects is reported.
    fn read_err<'c>(&self, commit: &'c str) -> impl Fn(String) -> RepoError + use<'_, 'c> {
        move |message| RepoError::Read {
            path: self.path.clone(),
            commit: commit.to_owned(),
            message,
        }
    }

    fn root_tree(&self, commit: &str) -> Result<gix::ObjectId, RepoError> {
        let read_err = self.read_err(commit);
        let id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(|e| read_err(e.to_string()))?;
        let mut buf = Vec::new();
        self.objects()
            .find_commit_iter(&id, &mut buf)
            .and_then(|mut c| c.tree_id())
            .map_err(|e| read_err(e.to_string()))
    }

    /// Who made `commit` and its message's first line, for the status page and notifications.
    pub fn commit_info(&self, commit: &str) -> Result<CommitInfo, RepoError> {
        self.read_commit(commit, |parsed| {
            let author = parsed.author().map_err(|e| e.to_string())?;
            Ok(CommitInfo {
                author: author.name.to_string(),
                summary: parsed.message_summary().to_string(),
                time: author.time().map_or(0, |t| t.seconds),
            })
        })
    }

    /// When `commit` was committed, in seconds since the epoch: its place in the watched ref's
    /// history, which a rebase keeps in order where author times may not be.
    pub fn commit_time(&self, commit: &str) -> Result<i64, RepoError> {
        self.read_commit(commit, |parsed| {
            let committer = parsed.committer().map_err(|e| e.to_string())?;
            Ok(committer.time().map_or(0, |t| t.seconds))
        })
    }

    /// What `read` takes from commit `commit`'s object.
    fn read_commit<T>(
        &self,
        commit: &str,
        read: impl FnOnce(gix::objs::CommitRef<'_>) -> Result<T, String>,
    ) -> Result<T, RepoError> {
        let read_err = self.read_err(commit);
        let id = gix::ObjectId::from_hex(commit.as_bytes()).map_err(|e| read_err(e.to_string()))?;
        let mut buf = Vec::new();
        let parsed = self
            .objects()
            .find_commit(&id, &mut buf)
            .map_err(|e| read_err(e.to_string()))?;
        read(parsed).map_err(read_err)
    }

    /// Resolves `rev` and reads its files.
    pub fn load(&self, rev: Option<&str>) -> Result<Snapshot, RepoError> {
        let commit = self.resolve(rev)?;
        self.snapshot(&commit)
    }

    /// The root commit of `commit`'s history: first parents followed to a commit that has
    /// none. It walks the whole first-parent history, so it is asked once, when a state records
    /// its repository (or to explain why another repository is refused).
    pub fn root_commit(&self, commit: &str) -> Result<String, RepoError> {
        let read_err = self.read_err(commit);
        let mut id =
            gix::ObjectId::from_hex(commit.as_bytes()).map_err(|e| read_err(e.to_string()))?;
        let mut buf = Vec::new();
        loop {
            let parent = self
                .objects()
                .find_commit_iter(&id, &mut buf)
                .map_err(|e| read_err(e.to_string()))?
                .parent_ids()
                .next();
            match parent {
                Some(parent) => id = parent,
                None => return Ok(id.to_string()),
            }
        }
    }

    /// Whether `id` (a full commit id) is a commit of this repository's object database: one
    /// lookup, no walk.
    pub fn has_commit(&self, id: &str) -> bool {
        let Ok(id) = gix::ObjectId::from_hex(id.as_bytes()) else {
            return false;
        };
        let mut buf = Vec::new();
        self.objects()
            .try_find(&id, &mut buf)
            .ok()
            .flatten()
            .is_some_and(|data| data.kind == gix::objs::Kind::Commit)
    }

    /// Whether `ancestor` is `commit` or in its history: their merge base is `ancestor`.
    /// git's merge-base walk, which stops where the two histories meet (no further back than
    /// the older of the two when one is in the other's history).
    pub fn is_ancestor(&self, ancestor: &str, commit: &str) -> Result<bool, RepoError> {
        Ok(ancestor == commit || self.merge_base(ancestor, commit)?.as_deref() == Some(ancestor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_alternate_object_directories_as_git_writes_them() {
        let split = |s: &str| split_alternates(OsStr::new(s));
        assert_eq!(split(""), Vec::<PathBuf>::new());
        assert_eq!(split("/a/objects"), [PathBuf::from("/a/objects")]);
        assert_eq!(
            split("/a/objects::/b/objects"),
            [PathBuf::from("/a/objects"), PathBuf::from("/b/objects")]
        );
        // git quotes an entry that contains the separator or starts with a quote.
        assert_eq!(
            split("/a/objects:\"/x:y/objects\":\"\\\"q\\\\/objects\""),
            [
                PathBuf::from("/a/objects"),
                PathBuf::from("/x:y/objects"),
                PathBuf::from("\"q\\/objects"),
            ]
        );
    }

    #[test]
    fn reads_only_folders_that_can_hold_wanted_files() {
        for dir in ["environments", "workloads/shop", "definitions/a/b"] {
            assert!(wanted_dir(dir), "{dir}");
        }
        for dir in ["environments2", "docs", "src/definitions", ".github"] {
            assert!(!wanted_dir(dir), "{dir}");
        }
    }

    /// A repository made with `git`: `main` changes a definition after `pr` branched off, and
    /// `pr` changes a workload, then (in a second commit) a definition of its own.
    fn branched_repo() -> (tempfile::TempDir, [String; 4]) {
        let dir = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        let write = |path: &str, text: &str| {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        git(&["init", "-q"]);
        write("definitions/db.yaml", "db v1\n");
        write("workloads/shop/web.yaml", "web v1\n");
        write("environments/test.yaml", "type: test\n");
        git(&["add", "-A"]);
        git(&["commit", "-qm", "base"]);
        let base = git(&["rev-parse", "HEAD"]);
        git(&["checkout", "-qb", "pr"]);
        write("workloads/shop/web.yaml", "web v2\n");
        git(&["commit", "-qam", "workload"]);
        let workloads_only = git(&["rev-parse", "HEAD"]);
        write("definitions/nested/tf.yaml", "local-exec\n");
        git(&["add", "-A"]);
        git(&["commit", "-qm", "a definition"]);
        let with_definition = git(&["rev-parse", "HEAD"]);
        git(&["checkout", "-q", "main"]);
        write("definitions/db.yaml", "db v2\n");
        git(&["commit", "-qam", "platform"]);
        let main = git(&["rev-parse", "HEAD"]);
        (dir, [base, workloads_only, with_definition, main])
    }

    #[test]
    fn a_branch_is_read_with_another_commits_platform_and_its_changes_outside_workloads_listed() {
        let (dir, [base, workloads_only, with_definition, main]) = branched_repo();
        let repo = ConfigRepo::open(dir.path()).unwrap();
        assert_eq!(
            repo.merge_base(&with_definition, &main).unwrap(),
            Some(base.clone())
        );
        assert!(
            repo.changed_outside_workloads(&base, &workloads_only, 10)
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            repo.changed_outside_workloads(&base, &with_definition, 10)
                .unwrap(),
            ["definitions/nested/tf.yaml"]
        );
        assert_eq!(
            repo.changed_outside_workloads(&with_definition, &main, 1)
                .unwrap()
                .len(),
            1,
            "at most the limit"
        );

        let composed = ConfigRepo::open(dir.path())
            .unwrap()
            .with_platform(&main)
            .unwrap();
        let files = composed.snapshot(&with_definition).unwrap().files;
        assert_eq!(
            files["workloads/shop/web.yaml"], b"web v2\n",
            "the branch's workload"
        );
        assert_eq!(
            files["definitions/db.yaml"], b"db v2\n",
            "the platform's definition"
        );
        assert!(
            !files.contains_key("definitions/nested/tf.yaml"),
            "not the branch's"
        );
        let layout = composed.layout(&with_definition).unwrap();
        let plain = repo.layout(&main).unwrap();
        assert_eq!(layout.shared, plain.shared);
        assert_eq!(layout.apps, repo.layout(&with_definition).unwrap().apps);
    }

    /// Finding: a branch behind main planned as reverting main's changes. Its merge into main
    /// keeps main's newer definition and the branch's own files, writes nothing to the
    /// repository, and names what both changed.
    #[test]
    fn a_branch_behind_is_read_as_its_merge_into_the_watched_ref() {
        let (dir, [base, workloads_only, with_definition, main]) = branched_repo();
        let objects = || {
            std::process::Command::new("git")
                .args(["count-objects", "-v"])
                .current_dir(dir.path())
                .output()
                .unwrap()
                .stdout
        };
        let before = objects();
        let (repo, merge) = ConfigRepo::open(dir.path())
            .unwrap()
            .merge_into(&main, &with_definition)
            .unwrap();
        let merge = merge.expect("the branch is behind main");
        assert_eq!(merge.base, base);
        assert_eq!(merge.behind, 1);
        assert!(merge.conflicts.is_empty(), "{merge:?}");
        let files = repo.snapshot(&merge.commit).unwrap().files;
        assert_eq!(
            files["definitions/db.yaml"], b"db v2\n",
            "main's newer file"
        );
        assert_eq!(
            files["workloads/shop/web.yaml"], b"web v2\n",
            "the branch's"
        );
        assert_eq!(
            files["definitions/nested/tf.yaml"], b"local-exec\n",
            "the branch's"
        );
        assert_eq!(objects(), before, "nothing written to the repository");
        // The merged layout: main's definitions folder changed by the branch, its app folder.
        let layout = repo.layout(&merge.commit).unwrap();
        assert_eq!(
            layout.apps,
            ConfigRepo::open(dir.path())
                .unwrap()
                .layout(&workloads_only)
                .unwrap()
                .apps
        );

        // A branch that holds main is its own merge result.
        let (_, none) = ConfigRepo::open(dir.path())
            .unwrap()
            .merge_into(&base, &with_definition)
            .unwrap();
        assert_eq!(none, None);

        // Both sides changing the same file is a conflict, named.
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{args:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        git(&["checkout", "-q", "pr"]);
        std::fs::write(dir.path().join("definitions/db.yaml"), "db v3\n").unwrap();
        git(&["commit", "-qam", "db on the branch"]);
        let conflicting = git(&["rev-parse", "HEAD"]);
        let (repo, merge) = ConfigRepo::open(dir.path())
            .unwrap()
            .merge_into(&main, &conflicting)
            .unwrap();
        let merge = merge.unwrap();
        assert_eq!(merge.conflicts, ["definitions/db.yaml"]);
        let files = repo.snapshot(&merge.commit).unwrap().files;
        assert_eq!(
            files["definitions/db.yaml"], b"db v2\n",
            "left as main has it"
        );
    }

    /// A daemon out of file descriptors (EMFILE) once reported "not a git repository": the
    /// cause is named, whatever error wraps it.
    #[test]
    fn running_out_of_file_descriptors_is_reported_as_such() {
        #[derive(Debug, thiserror::Error)]
        #[error("could not open the git directory")]
        struct Wrapper(#[source] std::io::Error);
        let e = Wrapper(std::io::Error::from_raw_os_error(24));
        let err = open_error(Path::new("/srv/git/platform.git"), &e);
        assert!(matches!(err, RepoError::OutOfFiles { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("out of file descriptors"), "{text}");
        assert!(text.contains("LimitNOFILE"), "{text}");
        let other = Wrapper(std::io::Error::from_raw_os_error(2));
        assert!(matches!(
            open_error(Path::new("/nowhere"), &other),
            RepoError::Open { .. }
        ));
    }
}
