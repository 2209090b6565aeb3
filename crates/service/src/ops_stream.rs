//! Send and receive (`tank send`, `tank receive`), bookmarks and `receive -A`.
//!
//! # Theory of operation
//! A send or a receive carries a stream, which does not fit the request/response shape of
//! [`Service::handle`]: [`Service::send_stream`] writes the stream to a writer and
//! [`Service::receive_stream`] reads it from a reader, each after the same authorization as
//! every request (administrators only). The CLI passes its standard output or input (in
//! process), or the daemon its connection (`tank` frames the stream there).
//!
//! The mount policy is zfs's: an increment into a mounted filesystem unmounts it (and every
//! other front end lets go of it) for the receive and mounts it again after; a dataset a
//! full stream created is mounted at its mountpoint by the daemon unless `-u`. A receive
//! cut midway and kept (`-s`) leaves the dataset unmounted (nothing serves it halfway); its
//! place is remembered, and the receive that finishes it (or `receive -A`) mounts it there
//! again. The dataset
//! layer (`recv.rs`) keeps the receive all or nothing per snapshot.

use std::io::{Read, Write};
use std::path::PathBuf;

use tank_dataset::recv::{self, RecvOptions};
use tank_dataset::send::{self, SendOptions};
use tank_dataset::stream::TransferError;
use tank_dataset::Op;

use crate::api::{Request, Response};
use crate::caller::{authorize, Caller};
use crate::error::ServiceError;
use crate::mounts::pool_of;
use crate::service::{Ctx, Res, Service};

/// A failed send or receive as the service reports it.
fn transfer_error(e: TransferError) -> ServiceError {
    match e {
        TransferError::Refused(m) => ServiceError::Invalid(m),
        TransferError::NoSpace(m) => ServiceError::NoSpace(m),
        TransferError::Stream(s) => ServiceError::Invalid(s.to_string()),
        TransferError::Dsl(d) => ServiceError::from_anyhow(&d.into()),
        TransferError::Object(o) => ServiceError::Store(o.to_string()),
        TransferError::Io(e) => ServiceError::Failed(format!("stream: {e}")),
    }
}

impl Service {
    /// Authorizes `req` for `caller` as `handle` does, then runs `f` with its context.
    fn stream_call(
        &self,
        caller: &Caller,
        req: Request,
        command: Option<String>,
        f: impl FnOnce(&mut Ctx, Request) -> Res<Response>,
    ) -> (Res<Response>, Vec<String>) {
        let mut ctx = Ctx {
            caller,
            command: command.unwrap_or_else(|| format!("api {}", req.op())),
            notes: Vec::new(),
        };
        let r = authorize(caller, &self.access(&req)).and_then(|()| f(&mut ctx, req));
        (r, ctx.notes)
    }

    /// `tank send`: writes the stream of `req` (a `Request::Send`) to `out`.
    pub fn send_stream(
        &self,
        caller: &Caller,
        req: Request,
        out: &mut dyn Write,
        command: Option<String>,
    ) -> (Res<Response>, Vec<String>) {
        self.stream_call(caller, req, command, |ctx, req| {
            self.send_inner(ctx, req, out)
        })
    }

    fn send_inner(&self, ctx: &mut Ctx, req: Request, out: &mut dyn Write) -> Res<Response> {
        let Request::Send {
            snapshot,
            from,
            intermediates,
            compressed,
            replicate,
            token,
            dry_run: _,
        } = req
        else {
            return Err(ServiceError::BadRequest("not a send request".into()));
        };
        let mut progress = |_bytes: u64| {};
        let summary = match (snapshot, token) {
            (Some(snap), None) => {
                let o = self.open_pool(pool_of(&snap), ctx)?;
                let opts = SendOptions {
                    from,
                    intermediates,
                    compressed,
                    replicate,
                };
                send::send(&o.dsl, &snap, &opts, out, &mut progress).map_err(transfer_error)?
            }
            (None, Some(token)) => {
                // The token names the snapshot by guid: look in every open pool.
                let pools = self.open_pools();
                let t = send::ResumeToken::decode(&token).map_err(transfer_error)?;
                let o = pools
                    .iter()
                    .find(|o| o.dsl.snapshot_by_guid(t.to_guid).is_some())
                    .ok_or_else(|| {
                        ServiceError::NotFound(format!(
                            "no open pool has the token's snapshot '{}'",
                            t.to_name
                        ))
                    })?;
                send::send_resume(&o.dsl, &token, out, &mut progress).map_err(transfer_error)?
            }
            _ => {
                return Err(ServiceError::Invalid(
                    "send takes a snapshot, or -t TOKEN".into(),
                ))
            }
        };
        Ok(Response::Transferred {
            snapshots: summary.snapshots,
            bytes: summary.bytes,
            rolled_back: vec![],
            skipped: vec![],
        })
    }

    /// `tank receive`: reads a stream for `req` (a `Request::Receive`) from `input`.
    pub fn receive_stream(
        &self,
        caller: &Caller,
        req: Request,
        input: &mut dyn Read,
        command: Option<String>,
    ) -> (Res<Response>, Vec<String>) {
        self.stream_call(caller, req, command, |ctx, req| {
            self.receive_inner(ctx, req, input)
        })
    }

    pub(crate) fn receive_inner(
        &self,
        ctx: &mut Ctx,
        req: Request,
        input: &mut dyn Read,
    ) -> Res<Response> {
        let Request::Receive {
            dataset,
            force,
            resumable,
            no_mount,
            props,
        } = req
        else {
            return Err(ServiceError::BadRequest("not a receive request".into()));
        };
        let o = self.open_pool(pool_of(&dataset), ctx)?;
        let opts = RecvOptions {
            force,
            resumable,
            props,
        };
        // An increment into a mounted filesystem: unmounted, and let go of by every front
        // end, for the receive; mounted again after.
        let existing = o.dsl.resolve(&dataset).ok();
        let mut was: Vec<(String, Option<PathBuf>)> = match existing {
            Some(_) => self
                .mounts
                .unmount_tree(&dataset)?
                .into_iter()
                .filter(|(n, _)| *n == dataset)
                .map(|(n, d)| (n, Some(d)))
                .collect(),
            None => Vec::new(),
        };
        // Unmounted by an earlier receive that was cut (and kept, -s): mounted again where
        // it was once this one ends.
        if was.is_empty() {
            if let Some(dir) = self.unmounted_for_receive.lock().remove(&dataset) {
                was.push((dataset.clone(), Some(dir)));
            }
        }
        let mut progress = |_bytes: u64| {};
        let result = match existing {
            Some(id) => self.mounts.handles().suspended(
                &o.dsl,
                id,
                &format!("receive into {dataset}"),
                || recv::receive(&o.dsl, &dataset, input, &opts, &mut progress),
            )?,
            None => recv::receive(&o.dsl, &dataset, input, &opts, &mut progress),
        };
        let unfinished = o
            .dsl
            .resolve(&dataset)
            .and_then(|id| o.dsl.record(id))
            .is_ok_and(|r| r.recv.is_some());
        match was.pop() {
            // Nothing serves a dataset halfway through a receive: its place is kept for
            // the receive that finishes it (or `receive -A`).
            Some((name, Some(dir))) if unfinished => {
                self.unmounted_for_receive.lock().insert(name, dir);
            }
            Some(w) => {
                for line in self.mounts.remount(&o.dsl, &o.store, &[w]) {
                    ctx.note(line);
                }
            }
            None => {}
        }
        let summary = result.map_err(transfer_error)?;
        for r in &summary.rolled_back {
            ctx.note(format!("rolled '{dataset}' back to '{r}' first (-F)"));
        }
        o.pool.log_history(&ctx.command);
        if existing.is_none() && !no_mount && self.is_daemon() {
            let is_fs = o
                .dsl
                .resolve(&dataset)
                .and_then(|id| o.dsl.record(id))
                .is_ok_and(|r| r.kind == tank_dataset::DatasetKind::Filesystem);
            if is_fs {
                for line in self
                    .mounts
                    .remount(&o.dsl, &o.store, &[(dataset.clone(), None)])
                {
                    ctx.note(line);
                }
            }
        }
        Ok(Response::Transferred {
            snapshots: summary.snapshots,
            bytes: summary.bytes,
            rolled_back: summary.rolled_back,
            skipped: summary.skipped,
        })
    }

    /// `receive -A` and `bookmark` (through `handle`).
    pub(crate) fn stream_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        match req {
            Request::ReceiveAbort { dataset } => {
                let o = self.open_pool(pool_of(&dataset), ctx)?;
                recv::abort(&o.dsl, &dataset).map_err(transfer_error)?;
                o.pool.log_history(&ctx.command);
                let was = self.unmounted_for_receive.lock().remove(&dataset);
                if let Some(dir) = was {
                    for line in self.mounts.remount(&o.dsl, &o.store, &[(dataset.clone(), Some(dir))]) {
                        ctx.note(line);
                    }
                }
                Ok(Response::Done {
                    message: format!("abandoned the unfinished receive into '{dataset}'"),
                })
            }
            Request::Bookmark { snapshot, bookmark } => {
                let o = self.open_pool(pool_of(&snapshot), ctx)?;
                o.dsl
                    .run(Op::Bookmark {
                        snapshot,
                        bookmark: bookmark.clone(),
                    })
                    .map_err(|e| ServiceError::from_anyhow(&e.into()))?;
                o.pool.log_history(&ctx.command);
                Ok(Response::DatasetNames(vec![bookmark]))
            }
            Request::Send {
                snapshot: Some(snap),
                from,
                intermediates,
                compressed,
                replicate,
                token: None,
                dry_run: true,
            } => {
                let o = self.open_pool(pool_of(&snap), ctx)?;
                let opts = SendOptions {
                    from,
                    intermediates,
                    compressed,
                    replicate,
                };
                let est = send::estimate(&o.dsl, &snap, &opts).map_err(transfer_error)?;
                Ok(Response::Transferred {
                    snapshots: est.snapshots,
                    bytes: est.bytes,
                    rolled_back: vec![],
                    skipped: vec![],
                })
            }
            Request::Send { .. } | Request::Receive { .. } => Err(ServiceError::BadRequest(
                "send and receive carry a stream: they go through the stream entry points (tank send, tank receive)".into(),
            )),
            _ => Err(ServiceError::BadRequest("not a stream request".into())),
        }
    }
}
