//! Backups to S3-compatible stores (`tank remote`, `tank send --to s3://`, `tank receive
//! --from s3://`): the requests, over the rules of `backup.rs`.
//!
//! # Theory of operation
//! A remote (endpoint, keys, region, and an encryption key if its backups are encrypted) is
//! a record of the daemon's settings store, like a replication task. A backup send runs the
//! dataset layer's send into a [`backup::Upload`] (through a [`backup::Sealer`] when the
//! remote encrypts), as a job (`backup`, with rate and time left); the upload's id is kept
//! in the settings store until it completes, so the same command run again after a failure
//! resumes it, sending only the parts the store lacks. The manifest is written last. A
//! restore reads the manifests under the prefix, picks the chain ([`backup::chain`]) and
//! receives each stream as `tank receive` would (the same mount policy, all or nothing per
//! snapshot), checking the object's size and SHA-256 against its manifest as it goes.
//! Each backup stored and each restore is a pool event (`sysevent.fs.tank.backup`,
//! `sysevent.fs.tank.restore`); a failed backup an `ereport.fs.tank.backup_failed`.

use std::io::{Read, Write};
use std::sync::Arc;

use rand::RngCore;
use tank_dataset::send::{self, SendOptions};
use tank_dataset::DatasetKind;

use std::collections::HashSet;

use crate::accounts::{validate_name, REMOTES, UPLOADS};
use crate::api::{BackupListing, RemoteInfo, ReplicationSpec, Request, Response};
use crate::backup::{self, Bucket, Manifest, Remote, Upload};
use crate::caller::Caller;
use crate::error::ServiceError;
use crate::jobs::Progress;
use crate::mounts::pool_of;
use crate::ops_replicate::{base_of, RunOutcome, Snap};
use crate::service::{Ctx, Res, Service};

/// An upload under way, as the settings store keeps it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct UploadState {
    upload: String,
    part: usize,
    started: u64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn failed(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Failed(e.to_string())
}

/// What a backup send did.
pub(crate) struct BackupOutcome {
    pub snapshots: Vec<String>,
    pub size: u64,
    pub stored_already: bool,
    /// Whether it went on with an upload begun before.
    pub resumed: bool,
}

/// Counts the bytes written through it.
struct Counting<W: Write> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl Service {
    pub(crate) fn backup_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        let accounts = self.accounts()?;
        match req {
            Request::RemoteAdd {
                name,
                endpoint,
                access_key,
                secret_key,
                region,
                encryption_key,
            } => {
                validate_name("remote", &name)?;
                if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                    return Err(ServiceError::Invalid(format!(
                        "the endpoint '{endpoint}' must be an http:// or https:// address"
                    )));
                }
                if access_key.is_empty() || secret_key.is_empty() {
                    return Err(ServiceError::Invalid(
                        "a remote needs an access key and a secret key".into(),
                    ));
                }
                let (key, shown) = match encryption_key.as_deref() {
                    None | Some("") => (None, None),
                    Some("generate") => {
                        let mut k = [0u8; 32];
                        rand::thread_rng().fill_bytes(&mut k);
                        let h = backup::hex(&k);
                        (Some(h.clone()), Some(h))
                    }
                    Some(h) => {
                        backup::parse_key(h).map_err(ServiceError::Invalid)?;
                        (Some(h.trim().to_lowercase()), None)
                    }
                };
                let r = Remote {
                    name: name.clone(),
                    endpoint,
                    access_key,
                    secret_key,
                    region: region.unwrap_or_else(|| "us-east-1".into()),
                    key,
                };
                accounts.put_setting(REMOTES, &name, &r)?;
                let mut message = format!("remote '{name}' is {}", r.endpoint);
                if let Some(k) = shown {
                    message.push_str(&format!(
                        "\nbackups through it are encrypted with this key; keep a copy apart \
                         from this machine (without it they cannot be read):\n{k}"
                    ));
                }
                Ok(Response::Done { message })
            }
            Request::RemoteList => {
                let all: Vec<Remote> = accounts.settings(REMOTES)?;
                Ok(Response::Remotes(
                    all.into_iter()
                        .map(|r| RemoteInfo {
                            key_id: r
                                .key
                                .as_deref()
                                .and_then(|k| backup::parse_key(k).ok())
                                .map(|k| backup::key_id(&k)),
                            name: r.name,
                            endpoint: r.endpoint,
                            access_key: r.access_key,
                            region: r.region,
                        })
                        .collect(),
                ))
            }
            Request::RemoteRemove { name } => {
                if !accounts.remove_setting(REMOTES, &name)? {
                    return Err(ServiceError::NotFound(format!("no remote '{name}'")));
                }
                Ok(Response::Done {
                    message: format!("removed remote '{name}'"),
                })
            }
            Request::BackupList { remote, url } => {
                let (r, bucket, prefix) = self.remote_bucket(&remote, &url)?;
                let (backups, unfinished) = list_backups(bucket.as_ref(), &prefix)?;
                drop(r);
                Ok(Response::Backups(BackupListing {
                    backups,
                    unfinished,
                }))
            }
            Request::BackupSend {
                snapshot,
                from,
                intermediates,
                remote,
                url,
            } => self
                .backup_send(
                    ctx,
                    &snapshot,
                    from,
                    intermediates,
                    &remote,
                    &url,
                    None,
                    None,
                )
                .map(|b| Response::Transferred {
                    bytes: b.size,
                    skipped: if b.stored_already {
                        vec![snapshot.clone()]
                    } else {
                        vec![]
                    },
                    snapshots: b.snapshots,
                    rolled_back: vec![],
                }),
            Request::BackupRestore {
                dataset,
                remote,
                url,
                snapshot,
                force,
                no_mount,
            } => self.backup_restore(ctx, &dataset, &remote, &url, snapshot, force, no_mount),
            _ => Err(ServiceError::BadRequest("not a backup request".into())),
        }
    }

    /// The remote `name` and a connection to the bucket of `url`, with the prefix.
    pub(crate) fn remote_bucket(
        &self,
        name: &str,
        url: &str,
    ) -> Res<(Remote, Arc<dyn Bucket>, String)> {
        let r: Remote = self.accounts()?.setting(REMOTES, name)?.ok_or_else(|| {
            ServiceError::NotFound(format!(
                "no remote '{name}' (add one with tank remote add {name} --endpoint ...)"
            ))
        })?;
        let (bucket, prefix) = backup::parse_url(url).map_err(ServiceError::Invalid)?;
        let connector = self
            .buckets
            .get()
            .ok_or_else(|| ServiceError::Failed("this program has no S3 client".into()))?;
        let b = connector
            .connect(&r, &bucket)
            .map_err(ServiceError::Invalid)?;
        Ok((r, Arc::from(b), prefix))
    }

    /// Stores the stream of `snapshot` (since `from`) under `url`; counted in `outer` (a
    /// replication task's job) or in a job of its own.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backup_send(
        &self,
        ctx: &mut Ctx,
        snapshot: &str,
        from: Option<String>,
        intermediates: bool,
        remote: &str,
        url: &str,
        outer: Option<&Arc<Progress>>,
        bwlimit: Option<u64>,
    ) -> Res<BackupOutcome> {
        let (r, bucket, prefix) = self.remote_bucket(remote, url)?;
        let o = self.open_pool(pool_of(snapshot), ctx)?;
        let transfer =
            |e: tank_dataset::stream::TransferError| ServiceError::Invalid(e.to_string());
        let sid = o
            .dsl
            .resolve(snapshot)
            .map_err(|e| ServiceError::from_anyhow(&anyhow::Error::from(e)))?;
        let rec = o
            .dsl
            .record(sid)
            .map_err(|e| ServiceError::from_anyhow(&anyhow::Error::from(e)))?;
        if rec.kind != DatasetKind::Snapshot {
            return Err(ServiceError::Invalid(format!(
                "'{snapshot}' is not a snapshot (POOL/DS@SNAP)"
            )));
        }
        let (dataset, short) = snapshot.split_once('@').expect("a snapshot name");
        let from_guid = match &from {
            Some(f) => send::base_guid(&o.dsl, snapshot, f).map_err(transfer)?,
            None => 0,
        };
        let key = backup::stream_key(&prefix, short, rec.guid, from_guid, intermediates);
        let mkey = backup::manifest_key(&key);
        // Stored already when both the stream and its manifest are there: one listing of
        // this stream's names, not a read of every manifest under the prefix.
        let names = bucket
            .list(key.trim_end_matches(".stream"))
            .map_err(failed)?;
        let there = |k: &str| names.iter().any(|o| o.key == k);
        if there(&key) && there(&mkey) {
            ctx.note(format!("{snapshot} is stored there already ({key})"));
            return Ok(BackupOutcome {
                snapshots: vec![],
                size: 0,
                stored_already: true,
                resumed: false,
            });
        }
        let opts = SendOptions {
            from: from.clone(),
            intermediates,
            compressed: true,
            replicate: false,
        };
        let est = send::estimate(&o.dsl, snapshot, &opts)
            .map_err(transfer)?
            .bytes;
        let crypt = r
            .key
            .as_deref()
            .map(backup::parse_key)
            .transpose()
            .map_err(ServiceError::Invalid)?;
        // The upload: the one under way for this object, or a new one.
        let accounts = self.accounts()?;
        let state_key = format!("{}/{}", r.name, url.trim_end_matches('/'))
            + "/"
            + key.rsplit('/').next().unwrap_or(&key);
        let held: Option<UploadState> = accounts.setting(UPLOADS, &state_key)?;
        let mut have = Vec::new();
        let mut state = None;
        if let Some(st) = held {
            // Gone from the store (completed, aborted, expired): a new one.
            if let Some(parts) = bucket.list_parts(&key, &st.upload).map_err(failed)? {
                have = parts;
                state = Some(st);
            }
        }
        let state = match state {
            Some(st) => st,
            None => UploadState {
                upload: bucket.create_multipart(&key).map_err(failed)?,
                part: backup::part_size(est),
                started: now_secs(),
            },
        };
        accounts.put_setting(UPLOADS, &state_key, &state)?;
        let resumed = !have.is_empty();
        let job = match outer {
            Some(j) => {
                j.set_total(est);
                j.clone()
            }
            None => {
                let j = Progress::new("backup", snapshot, est);
                self.jobs.start(j.clone());
                j
            }
        };
        let start = std::time::Instant::now();
        let result = (|| -> Res<(backup::UploadSummary, u64, Vec<String>)> {
            let jp = job.clone();
            let jc = job.clone();
            let up = Upload::new(
                bucket.clone(),
                &key,
                state.upload.clone(),
                state.part,
                have,
                Box::new(move |done| {
                    jp.advance(done, start.elapsed(), format!("{done} bytes stored"));
                }),
                Box::new(move || jc.canceled()),
            );
            let mut nothing = |_: u64| {};
            // Paced (a task's --bwlimit) as the bytes leave for the store.
            let up = backup::Throttle::new(up, bwlimit);
            let (up, sent) = match &crypt {
                Some(k) => {
                    let mut w = Counting {
                        inner: backup::Sealer::new(up, k, &key),
                        bytes: 0,
                    };
                    let s = send::send(&o.dsl, snapshot, &opts, &mut w, &mut nothing)
                        .map_err(transfer)?;
                    (w.inner.finish().map_err(failed)?, s)
                }
                None => {
                    let mut w = Counting {
                        inner: up,
                        bytes: 0,
                    };
                    let s = send::send(&o.dsl, snapshot, &opts, &mut w, &mut nothing)
                        .map_err(transfer)?;
                    (w.inner, s)
                }
            };
            let summary = up.inner.finish().map_err(failed)?;
            Ok((summary, sent.bytes, sent.snapshots))
        })();
        let events = o.pool.events.clone();
        let (summary, stream_bytes, snapshots) = match result {
            Ok(x) => x,
            Err(e) => {
                events.post(
                    "ereport.fs.tank.backup_failed",
                    None,
                    format!("snapshot={snapshot} url={url} error={e}"),
                );
                if outer.is_none() {
                    job.end(Err(e.to_string()));
                }
                return Err(ServiceError::Failed(format!(
                    "{e}\nthe upload is kept: the same command again resumes it (the parts \
                     the store has are not sent again)"
                )));
            }
        };
        let manifest = Manifest {
            version: backup::MANIFEST_VERSION,
            dataset: dataset.to_string(),
            snapshot: short.to_string(),
            to_guid: rec.guid,
            creation: rec.creation,
            from: from.as_ref().map(|f| {
                f.rsplit_once(['@', '#'])
                    .map(|(_, s)| {
                        if f.contains('#') {
                            format!("#{s}")
                        } else {
                            s.to_string()
                        }
                    })
                    .unwrap_or_else(|| f.clone())
            }),
            from_guid,
            snapshots: snapshots
                .iter()
                .map(|s| s.rsplit('@').next().unwrap_or(s).to_string())
                .collect(),
            size: summary.size,
            sha256: summary.sha256.clone(),
            stream_bytes,
            compressed: true,
            key_id: crypt.as_ref().map(backup::key_id),
            stored: now_secs(),
            object: key.clone(),
        };
        let json = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
        bucket.put(&mkey, &json).map_err(failed)?;
        accounts.remove_setting(UPLOADS, &state_key)?;
        events.post(
            "sysevent.fs.tank.backup",
            None,
            format!("snapshot={snapshot} object={key} bytes={}", summary.size),
        );
        let line = format!(
            "stored {snapshot} as {key}: {} bytes in {} parts{}{}",
            summary.size,
            summary.parts,
            if resumed {
                format!(
                    " (resumed: {} parts were there, {} bytes sent)",
                    summary.skipped, summary.sent_bytes
                )
            } else {
                String::new()
            },
            if crypt.is_some() { ", encrypted" } else { "" }
        );
        if outer.is_none() {
            job.end(Ok(line.clone()));
        }
        ctx.note(line);
        o.pool.log_history(&ctx.command);
        Ok(BackupOutcome {
            snapshots,
            size: summary.size,
            stored_already: false,
            resumed,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn backup_restore(
        &self,
        ctx: &mut Ctx,
        dataset: &str,
        remote: &str,
        url: &str,
        snapshot: Option<String>,
        force: bool,
        no_mount: bool,
    ) -> Res<Response> {
        let (r, bucket, prefix) = self.remote_bucket(remote, url)?;
        let (manifests, _) = list_backups(bucket.as_ref(), &prefix)?;
        let o = self.open_pool(pool_of(dataset), ctx)?;
        let have: Vec<u64> = match o.dsl.resolve(dataset) {
            Ok(id) => o
                .dsl
                .snapshots(id)
                .into_iter()
                .filter_map(|s| o.dsl.record(s).ok().map(|r| r.guid))
                .collect(),
            Err(_) => Vec::new(),
        };
        let chain =
            backup::chain(&manifests, snapshot.as_deref(), &have).map_err(ServiceError::Invalid)?;
        let key = r
            .key
            .as_deref()
            .map(backup::parse_key)
            .transpose()
            .map_err(ServiceError::Invalid)?;
        let total: u64 = chain.iter().map(|m| m.size).sum();
        let job = Progress::new("restore", dataset, total);
        self.jobs.start(job.clone());
        let start = std::time::Instant::now();
        let mut out = Response::Transferred {
            snapshots: vec![],
            bytes: 0,
            rolled_back: vec![],
            skipped: vec![],
        };
        let mut done = 0u64;
        for m in &chain {
            let result = self.restore_one(
                ctx,
                m,
                bucket.as_ref(),
                key.as_ref(),
                dataset,
                force,
                no_mount,
            );
            let got = match result {
                Ok(g) => g,
                Err(e) => {
                    job.end(Err(e.to_string()));
                    return Err(e);
                }
            };
            done += m.size;
            job.advance(done, start.elapsed(), format!("received {}", m.snapshot));
            if let (
                Response::Transferred {
                    snapshots,
                    bytes,
                    rolled_back,
                    ..
                },
                Response::Transferred {
                    snapshots: s,
                    bytes: b,
                    rolled_back: rb,
                    ..
                },
            ) = (&mut out, got)
            {
                snapshots.extend(s);
                *bytes += b;
                rolled_back.extend(rb);
            }
        }
        if chain.is_empty() {
            ctx.note(format!("'{dataset}' has the newest backup already"));
        }
        o.pool.events.post(
            "sysevent.fs.tank.restore",
            None,
            format!("dataset={dataset} url={url} streams={}", chain.len()),
        );
        job.end(Ok(format!("{} streams received", chain.len())));
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn restore_one(
        &self,
        ctx: &mut Ctx,
        m: &Manifest,
        bucket: &dyn Bucket,
        key: Option<&[u8; 32]>,
        dataset: &str,
        force: bool,
        no_mount: bool,
    ) -> Res<Response> {
        if let Some(id) = &m.key_id {
            match key {
                None => {
                    return Err(ServiceError::Invalid(format!(
                        "{} is encrypted (key id {id}): add the remote with its --encryption-key",
                        m.object
                    )))
                }
                Some(k) if backup::key_id(k) != *id => {
                    return Err(ServiceError::Invalid(format!(
                        "{} is encrypted with key id {id}, not this remote's {}",
                        m.object,
                        backup::key_id(k)
                    )))
                }
                Some(_) => {}
            }
        }
        let object = bucket.get(&m.object).map_err(failed)?;
        let mut hashed = backup::Hashing::new(object);
        let req = Request::Receive {
            dataset: dataset.to_string(),
            force,
            resumable: false,
            no_mount,
            props: vec![],
        };
        let got = match (key, &m.key_id) {
            (Some(k), Some(_)) => {
                let mut opened = backup::Opener::new(&mut hashed, k);
                let r = self.receive_inner(ctx, req, &mut opened);
                // Read to the end: the object's hash covers every byte.
                let _ = std::io::copy(&mut opened, &mut std::io::sink());
                r
            }
            _ => self.receive_inner(ctx, req, &mut hashed),
        };
        let got = got.map_err(|e| ServiceError::Invalid(format!("{}: {e}", m.object)))?;
        let _ = std::io::copy(&mut hashed, &mut std::io::sink());
        use sha2::Digest;
        let sha = backup::hex(&hashed.hash.clone().finalize());
        if hashed.bytes != m.size || sha != m.sha256 {
            return Err(ServiceError::Invalid(format!(
                "{}: the object is not the one its manifest describes ({} bytes, SHA-256 {sha}; the manifest says {} bytes, {})",
                m.object, hashed.bytes, m.size, m.sha256
            )));
        }
        Ok(got)
    }
}

impl Service {
    /// A replication task's run to an `s3://` target: the streams since the newest snapshot
    /// stored there (or the task's cursor bookmark), stored as backups; a new chain with a
    /// full stream when there is none, or once the chain has `full_every` streams; with
    /// `prune`, the chains none of whose snapshots the source has are deleted (never the
    /// newest chain).
    pub(crate) fn replicate_s3(
        &self,
        spec: &ReplicationSpec,
        job: &Arc<Progress>,
        snaps: &[Snap],
        cursor: Option<(&str, u64)>,
    ) -> Res<RunOutcome> {
        let remote = spec
            .remote
            .as_deref()
            .ok_or_else(|| ServiceError::Invalid("an s3:// target needs --remote NAME".into()))?;
        let (_, bucket, prefix) = self.remote_bucket(remote, &spec.target)?;
        let (manifests, _) = list_backups(bucket.as_ref(), &prefix)?;
        let stored: HashSet<u64> = manifests.iter().map(|m| m.to_guid).collect();
        let newest = snaps.last().cloned().expect("checked by the caller");
        let full_name = |s: &Snap| format!("{}@{}", spec.source, s.0);
        let caller = Caller::Admin {
            name: "replication".into(),
        };
        let mut ctx = Ctx {
            caller: &caller,
            command: format!("replicate {}", spec.name),
            notes: Vec::new(),
        };
        let mut out = RunOutcome {
            sent: Vec::new(),
            bytes: 0,
            pruned: Vec::new(),
            newest: Some(newest.clone()),
            resumed: false,
        };
        let mut send = |out: &mut RunOutcome, snap: &str, from: Option<String>, inter: bool| {
            let b = self.backup_send(
                &mut ctx,
                snap,
                from,
                inter,
                remote,
                &spec.target,
                Some(job),
                spec.bwlimit,
            )?;
            out.resumed |= b.resumed;
            out.bytes += b.size;
            out.sent.extend(b.snapshots);
            Res::Ok(())
        };
        let chain_len = backup::chain(&manifests, None, &[]).map_or(0, |c| c.len());
        let new_chain = spec.full_every > 0 && chain_len >= spec.full_every as usize;
        match base_of(spec, snaps, cursor, &stored) {
            Some((b, _)) if b == full_name(&newest) => {}
            Some(_) if new_chain => send(&mut out, &full_name(&newest), None, false)?,
            Some((b, is_snap)) => send(&mut out, &full_name(&newest), Some(b), is_snap)?,
            None => {
                // The first run: the oldest snapshot whole, then the rest.
                let first = full_name(&snaps[0]);
                send(&mut out, &first, None, false)?;
                if first != full_name(&newest) {
                    send(&mut out, &full_name(&newest), Some(first), true)?;
                }
            }
        }
        if spec.prune {
            let (manifests, _) = list_backups(bucket.as_ref(), &prefix)?;
            let on_source: HashSet<u64> = snaps.iter().map(|s| s.1).collect();
            let chains = chains_of(&manifests);
            let newest_chain = chains
                .iter()
                .position(|c| c.iter().any(|m| m.to_guid == newest.1));
            for (i, c) in chains.iter().enumerate() {
                if Some(i) == newest_chain || c.iter().any(|m| on_source.contains(&m.to_guid)) {
                    continue;
                }
                // Manifests first: a chain half deleted is never restored from.
                for m in c {
                    bucket
                        .delete(&backup::manifest_key(&m.object))
                        .map_err(failed)?;
                }
                for m in c {
                    bucket.delete(&m.object).map_err(failed)?;
                    out.pruned.push(m.object.clone());
                }
            }
        }
        Ok(out)
    }
}

/// The chains of `manifests`: each starts with a full stream; an increment joins the newest
/// chain holding its base.
fn chains_of(manifests: &[Manifest]) -> Vec<Vec<&Manifest>> {
    let mut sorted: Vec<&Manifest> = manifests.iter().collect();
    sorted.sort_by_key(|m| (m.creation, m.stored));
    let mut chains: Vec<Vec<&Manifest>> = Vec::new();
    for m in sorted {
        let home = (m.from_guid != 0)
            .then(|| {
                chains
                    .iter()
                    .rposition(|c| c.iter().any(|x| x.to_guid == m.from_guid))
            })
            .flatten();
        match home {
            Some(i) => chains[i].push(m),
            None => chains.push(vec![m]),
        }
    }
    chains
}

/// The manifests under `prefix` (directly under it), and the stream objects without one.
fn list_backups(bucket: &dyn Bucket, prefix: &str) -> Res<(Vec<Manifest>, Vec<String>)> {
    let dir = if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}/")
    };
    let objects = bucket.list(&dir).map_err(failed)?;
    let direct = |k: &str| !k[dir.len()..].contains('/');
    let streams: Vec<&str> = objects
        .iter()
        .map(|o| o.key.as_str())
        .filter(|k| direct(k) && k.ends_with(".stream"))
        .collect();
    let mut manifests = Vec::new();
    for o in objects
        .iter()
        .filter(|o| direct(&o.key) && o.key.ends_with(".json"))
    {
        let mut raw = Vec::new();
        bucket
            .get(&o.key)
            .map_err(failed)?
            .take(1 << 20)
            .read_to_end(&mut raw)
            .map_err(failed)?;
        let m: Manifest = serde_json::from_slice(&raw).map_err(|e| {
            ServiceError::Invalid(format!("{} is not a tank backup manifest: {e}", o.key))
        })?;
        if m.version != backup::MANIFEST_VERSION {
            return Err(ServiceError::Invalid(format!(
                "{} is a manifest of version {} (this tank reads {})",
                o.key,
                m.version,
                backup::MANIFEST_VERSION
            )));
        }
        if streams.contains(&m.object.as_str()) {
            manifests.push(m);
        }
    }
    manifests.sort_by_key(|m| (m.creation, m.stored));
    let unfinished = streams
        .iter()
        .filter(|s| !manifests.iter().any(|m| m.object == **s))
        .map(|s| s.to_string())
        .collect();
    Ok((manifests, unfinished))
}
