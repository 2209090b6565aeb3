//! The directory's part of send and receive: bookmarks, and the sync tasks that bracket a
//! receive (`recv.rs` moves the data between them).
//!
//! # Theory of operation
//! A receive is all or nothing per snapshot. `RecvBegin` checks the target against the
//! stream (a full stream creates a new dataset; an incremental one needs the target's
//! latest snapshot to be the stream's base and nothing written since, or `-F`, which rolls
//! it back first) and marks the head with a [`RecvState`]: from then on the dataset is
//! *inconsistent* and is neither mounted nor served. The stream's changes then go into the
//! head's own tree in ordinary transactions. `RecvEnd` takes the snapshot with the stream's
//! guid and creation time and clears the mark, in one sync task. `RecvAbort` undoes an
//! unfinished receive: a dataset the receive created is destroyed, any other is rolled back
//! to its latest snapshot, which is exactly its state before the receive began. A pool
//! opened with a mark left by a crash aborts that receive, unless it was resumable
//! (`receive -s`): then the mark stays, and the head's receive progress item says where to
//! resume.

use super::*;

/// What `RecvBegin` is asked to set up.
#[derive(Debug, Clone)]
pub struct RecvBegin {
    pub name: String,
    pub kind: DatasetKind,
    /// A dataset a full stream creates gets these local properties.
    pub props: Vec<(String, String)>,
    pub state: RecvState,
    /// `receive -F`: roll the target back to the stream's base first.
    pub force: bool,
}

impl Dsl {
    /// A bookmark by its full name (`POOL/DS#NAME`): the head it belongs to and the mark.
    pub fn bookmark(&self, name: &str) -> Res<(u64, Bookmark)> {
        let (ds, mark) = name
            .split_once('#')
            .ok_or_else(|| DslError::Invalid(format!("'{name}' is not a bookmark name")))?;
        let head = self.resolve(ds)?;
        self.record(head)?
            .bookmarks
            .iter()
            .find(|b| b.name == mark)
            .cloned()
            .map(|b| (head, b))
            .ok_or_else(|| DslError::NotFound(name.to_string()))
    }

    /// The snapshot with this guid, anywhere in the pool.
    pub fn snapshot_by_guid(&self, guid: u64) -> Option<u64> {
        let st = self.state.lock();
        st.records
            .values()
            .find(|r| r.kind == DatasetKind::Snapshot && r.guid == guid)
            .map(|r| r.id)
    }

    /// Aborts every receive a crash interrupted that is not resumable (at open).
    pub(super) fn abort_interrupted_receives(&self) -> Res<()> {
        let names: Vec<String> = {
            let st = self.state.lock();
            let pool = self.pool_name();
            st.records
                .values()
                .filter(|r| r.recv.as_ref().is_some_and(|s| !s.resumable))
                .map(|r| st.full_name(&pool, r.id))
                .collect()
        };
        for name in names {
            self.run(Op::RecvAbort { name: name.clone() })?;
            self.store.pool().events.post(
                "sysevent.fs.zfs.receive_aborted",
                None,
                format!("dataset={name} reason=interrupted"),
            );
        }
        Ok(())
    }

    pub(super) fn op_bookmark(
        &self,
        st: &mut State,
        snapshot: &str,
        bookmark: &str,
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let sid = st.resolve(&pool, snapshot)?;
        let s = st.rec(sid)?.clone();
        if s.kind != DatasetKind::Snapshot {
            return Err(DslError::Invalid(format!("'{snapshot}' is not a snapshot")));
        }
        let (ds, mark) = bookmark.split_once('#').ok_or_else(|| {
            DslError::Invalid(format!(
                "'{bookmark}' is not a bookmark name (dataset#name)"
            ))
        })?;
        if st.resolve(&pool, ds)? != s.parent {
            return Err(DslError::Invalid(format!(
                "a bookmark of '{snapshot}' must be in its dataset ('{}#{mark}')",
                st.full_name(&pool, s.parent)
            )));
        }
        if !valid_component(mark) || mark.contains('@') {
            return Err(DslError::Invalid(format!(
                "invalid bookmark name '{bookmark}'"
            )));
        }
        let head = st.rec_mut(s.parent)?;
        if head.bookmarks.iter().any(|b| b.name == mark) {
            return Err(DslError::Exists(bookmark.to_string()));
        }
        head.bookmarks.push(Bookmark {
            name: mark.to_string(),
            guid: s.guid,
            txg: s.txg,
            creation: now_secs(),
        });
        Ok(vec![s.parent])
    }

    pub(super) fn op_destroy_bookmark(&self, st: &mut State, bookmark: &str) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let (ds, mark) = bookmark
            .split_once('#')
            .ok_or_else(|| DslError::Invalid(format!("'{bookmark}' is not a bookmark name")))?;
        let head = st.resolve(&pool, ds)?;
        let r = st.rec_mut(head)?;
        let before = r.bookmarks.len();
        r.bookmarks.retain(|b| b.name != mark);
        if r.bookmarks.len() == before {
            return Err(DslError::NotFound(bookmark.to_string()));
        }
        Ok(vec![head])
    }

    pub(super) fn op_recv_begin(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        b: &RecvBegin,
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let name = &b.name;
        let Ok(id) = st.resolve(&pool, name) else {
            if b.state.from_guid != 0 {
                return Err(DslError::Invalid(format!(
                    "cannot receive incremental stream: destination '{name}' does not exist"
                )));
            }
            let created = self.op_create(st, ctx, name, b.kind, &b.props, false)?;
            let id = *created.last().expect("create makes the dataset");
            st.rec_mut(id)?.recv = Some(RecvState {
                created: true,
                ..b.state.clone()
            });
            return Ok(created);
        };
        let r = st.rec(id)?.clone();
        if r.kind == DatasetKind::Snapshot {
            return Err(DslError::Invalid(format!(
                "cannot receive into '{name}': it is a snapshot"
            )));
        }
        if let Some(cur) = &r.recv {
            if cur.to_guid == b.state.to_guid && cur.from_guid == b.state.from_guid {
                return Ok(vec![id]);
            }
            return Err(DslError::Busy(format!(
                "'{name}' has an unfinished receive of '{}': resume it with 'tank send -t TOKEN' (its receive_resume_token), or abandon it with 'tank receive -A {name}'",
                cur.to_name
            )));
        }
        if b.state.from_guid == 0 {
            return Err(DslError::Exists(name.to_string()));
        }
        if r.kind != b.kind {
            return Err(DslError::Invalid(format!(
                "cannot receive into '{name}': the stream carries a {}, '{name}' is a {}",
                b.kind.name(),
                r.kind.name()
            )));
        }
        let snaps = st.snapshots(id);
        for s in &snaps {
            let sr = st.rec(*s)?;
            if sr.guid == b.state.to_guid || sr.name == b.state.snapshot {
                return Err(DslError::Exists(st.full_name(&pool, *s)));
            }
        }
        let latest = snaps.last().copied();
        let Some(base) = snaps
            .iter()
            .copied()
            .find(|s| st.rec(*s).is_ok_and(|r| r.guid == b.state.from_guid))
        else {
            let latest_name = latest.map_or("none".to_string(), |l| st.full_name(&pool, l));
            return Err(DslError::Invalid(format!(
                "cannot receive incremental stream: '{name}' has no snapshot that is the stream's base (guid {:#018x}); its latest snapshot is {latest_name}",
                b.state.from_guid
            )));
        };
        let modified = r.written > 0;
        if Some(base) != latest || modified {
            if !b.force {
                let why = if Some(base) != latest {
                    format!(
                        "the stream's base {} is not its latest snapshot",
                        st.full_name(&pool, base)
                    )
                } else {
                    "it has been modified since its latest snapshot".to_string()
                };
                return Err(DslError::Busy(format!(
                    "cannot receive into '{name}': {why} (use -F to roll it back)"
                )));
            }
            let base_name = st.full_name(&pool, base);
            self.op_rollback(st, ctx, &base_name, true)?;
        }
        st.rec_mut(id)?.recv = Some(RecvState {
            created: false,
            ..b.state.clone()
        });
        Ok(vec![id])
    }

    /// The head `name` and its receive in progress.
    fn receiving(&self, st: &State, name: &str) -> Res<(u64, RecvState)> {
        let id = st.resolve(&self.pool_name(), name)?;
        let state = st
            .rec(id)?
            .recv
            .clone()
            .ok_or_else(|| DslError::Invalid(format!("'{name}' has no receive in progress")))?;
        Ok((id, state))
    }

    pub(super) fn op_recv_end(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        name: &str,
    ) -> Res<Vec<u64>> {
        let (id, state) = self.receiving(st, name)?;
        let snap = format!("{name}@{}", state.snapshot);
        let sid = *self
            .op_snapshot(st, ctx, &[snap], false)?
            .first()
            .expect("one snapshot taken");
        let s = st.rec_mut(sid)?;
        s.guid = state.to_guid;
        s.creation = state.creation;
        st.rec_mut(id)?.recv = None;
        Ok(vec![id, sid])
    }

    pub(super) fn op_recv_abort(
        &self,
        st: &mut State,
        ctx: &HookContext<'_>,
        name: &str,
    ) -> Res<Vec<u64>> {
        let pool = self.pool_name();
        let (id, state) = self.receiving(st, name)?;
        if state.created {
            return self.op_destroy(st, ctx, name, false, false);
        }
        let latest = st.snapshots(id).last().copied().ok_or_else(|| {
            DslError::Corrupt(format!(
                "'{name}' is receiving an increment but has no snapshot"
            ))
        })?;
        let latest_name = st.full_name(&pool, latest);
        let out = self.op_rollback(st, ctx, &latest_name, false)?;
        st.rec_mut(id)?.recv = None;
        Ok(out)
    }
}
