//! Pool requests: create, import, export, destroy, status, list, history, events, scrub,
//! resilver, device changes and properties (the zpool vocabulary).
//!
//! # Theory of operation
//! Each request opens the pool through the service's table (it stays open for the
//! service's life), takes the pool's lock when it changes something, and logs the change
//! in the pool history with the caller's command line. A scan (scrub, resilver) is started
//! here and runs in the background of whoever holds the pool; the response says so, and a
//! client that must wait (a command without a daemon, or `-w`) follows it with status
//! requests. Export and destroy unmount the pool's filesystems first, as zpool does.

use anyhow::{bail, Context};
use tank_object::ScanPhase;
use tank_pool::{CreateOptions, ImportOptions, Pool, PoolSpec};

use crate::api::{
    PoolEvent, PoolProp, PoolReport, PoolSummary, Request, Response, ScanReport,
    ScrubAction as ScanAction,
};
use crate::error::ServiceError;
use crate::pools::{
    cache_entry, host_identity, member_of, open_datasets, open_for_create, scan_dirs, Opened,
    PoolCache,
};
use crate::service::{Ctx, Res, Service};

impl Service {
    pub(crate) fn pool_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        use Request as R;
        match req {
            R::PoolList { names } => self.pool_list(ctx, names),
            R::PoolStatus { name } => self.pool_status(ctx, name),
            R::PoolCreate {
                name,
                spec,
                size,
                force,
                ashift,
            } => self.pool_create(ctx, &name, &spec, size, force, ashift),
            R::PoolImport {
                name,
                dirs,
                rewind,
                force,
                missing_log,
            } => self.pool_import(ctx, name, dirs, rewind, force, missing_log),
            R::PoolExport { name } => self.pool_export(ctx, &name),
            R::PoolDestroy { name } => self.pool_destroy(ctx, &name),
            R::PoolHistory { name } => {
                let mut out = Vec::new();
                for n in self.names_or_all(name)? {
                    let o = self.open_pool(&n, ctx)?;
                    out.push((n, o.pool.history().map_err(anyhow::Error::from)?));
                }
                Ok(Response::History { pools: out })
            }
            R::PoolEvents { name, since } => {
                let mut all = Vec::new();
                for n in self.names_or_all(name)? {
                    let o = self.open_pool(&n, ctx)?;
                    all.extend(o.pool.events.since(since).into_iter().map(|e| PoolEvent {
                        pool: n.clone(),
                        seq: e.seq,
                        time: e.time,
                        class: e.class,
                        vdev: e.vdev,
                        detail: e.detail,
                    }));
                }
                all.sort_by(|x, y| x.time.total_cmp(&y.time));
                Ok(Response::Events(all))
            }
            R::PoolEventsClear { name } => {
                let names = self.names_or_all(name)?;
                for n in &names {
                    let o = self.open_pool(n, ctx)?;
                    o.pool.events.clear();
                }
                Ok(Response::Done {
                    message: format!("cleared the events of {}", names.join(", ")),
                })
            }
            R::PoolScrub { name, action } => self.pool_scrub(ctx, &name, action),
            R::PoolResilver { name } => self.changing(ctx, &name, |o, _| {
                let st = o.store.scan_status();
                if st.running && st.state.func == "resilver" {
                    let message = if self.is_daemon() {
                        format!("a resilver is running; 'tank pool status {name}' shows its progress")
                    } else {
                        format!("resuming the resilver of pool '{name}'")
                    };
                    return Ok(self.scan_started(&name, Vec::new(), message));
                }
                self.resilver_missed(o, Vec::new())
            }),
            R::PoolOffline {
                name,
                device,
                temporary,
            } => self.changing(ctx, &name, |o, ctx| {
                o.pool
                    .offline(&device, temporary)
                    .map_err(anyhow::Error::from)?;
                o.pool.log_history(&ctx.command);
                o.store.sync().map_err(anyhow::Error::from)?;
                Ok(Response::Done {
                    message: format!(
                        "{device} of pool '{name}' is offline{}",
                        if temporary { " until export" } else { "" }
                    ),
                })
            }),
            R::PoolOnline { name, device } => self.changing(ctx, &name, |o, ctx| {
                let missed = o.pool.online(&device).map_err(anyhow::Error::from)?;
                o.pool.log_history(&ctx.command);
                match missed {
                    Some((first, last)) => self.resilver_missed(
                        o,
                        vec![format!("{device} is online; it missed txgs {first}..={last}")],
                    ),
                    None => Ok(Response::Done {
                        message: format!("{device} is online"),
                    }),
                }
            }),
            R::PoolClear { name, device } => {
                if device.is_none() && self.is_suspended(&name, ctx)? {
                    self.resume_suspended(ctx, &name)
                } else {
                    self.changing(ctx, &name, |o, ctx| self.clear_errors(o, ctx, &name, device))
                }
            }
            R::PoolReplace {
                name,
                old,
                new,
                size,
                force,
            } => self.changing(ctx, &name, |o, ctx| {
                let leaves = o.pool.leaf_list();
                let (_, old_leaf) = o.pool.find_leaf(&old).map_err(anyhow::Error::from)?;
                // Without NEW, the disk at the old device's place (for a slot a hot spare
                // stands in for: the failed device's, not the spare's).
                let new = new.unwrap_or_else(|| {
                    old_leaf
                        .spare_for()
                        .map_or_else(|| old_leaf.path(), |(_, path)| path)
                });
                if new == old_leaf.path() {
                    // The same device again (a disk swapped in place): only once it is
                    // out of use.
                    if old_leaf.is_usable() {
                        bail!(ServiceError::Busy(format!(
                            "cannot replace {old} with itself while it is {}; take it offline first, or name a new device",
                            old_leaf.state().name()
                        )));
                    }
                    old_leaf.close();
                } else if leaves.iter().any(|(_, l)| l.path() == new) {
                    bail!(ServiceError::Invalid(format!(
                        "cannot replace {old} with {new}: it is already a device of this pool"
                    )));
                }
                let mut devs = open_for_create(std::slice::from_ref(&new), size)?;
                let dev = devs.remove(&new).expect("opened");
                let (first, last) = o
                    .pool
                    .replace(&old, &new, dev, force)
                    .map_err(anyhow::Error::from)?;
                self.devices_changed(o, ctx)?;
                self.resilver_missed(
                    o,
                    vec![format!(
                        "{old} replaced by {new}; it lacks txgs {first}..={last} until the resilver rebuilt it"
                    )],
                )
            }),
            R::PoolAttach {
                name,
                existing,
                new,
                size,
                force,
            } => self.changing(ctx, &name, |o, ctx| {
                if o.pool.leaf_list().iter().any(|(_, l)| l.path() == new) {
                    bail!(ServiceError::Invalid(format!(
                        "cannot attach {new} to {existing}: it is already a device of this pool"
                    )));
                }
                let mut devs = open_for_create(std::slice::from_ref(&new), size)?;
                let dev = devs.remove(&new).expect("opened");
                let (first, last) = o
                    .pool
                    .attach(&existing, &new, dev, force)
                    .map_err(anyhow::Error::from)?;
                self.devices_changed(o, ctx)?;
                self.resilver_missed(
                    o,
                    vec![format!(
                        "{new} attached to {existing}; it lacks txgs {first}..={last} until the resilver rebuilt it"
                    )],
                )
            }),
            R::PoolDetach { name, device } => self.changing(ctx, &name, |o, ctx| {
                o.pool.detach(&device).map_err(anyhow::Error::from)?;
                self.devices_changed(o, ctx)?;
                o.store.sync().map_err(anyhow::Error::from)?;
                Ok(Response::Done {
                    message: format!("{device} detached from pool '{name}'"),
                })
            }),
            R::PoolAdd {
                name,
                spec,
                size,
                force,
            } => self.changing(ctx, &name, |o, ctx| {
                let spec = PoolSpec::parse_add(&spec, force)?;
                let leaves = o.pool.leaf_list();
                for d in spec.all_devices() {
                    if leaves.iter().any(|(_, l)| l.path() == d) {
                        bail!(ServiceError::Invalid(format!(
                            "cannot add: '{d}' is already a device of this pool"
                        )));
                    }
                }
                let devices = open_for_create(&spec.all_devices(), size)?;
                o.pool
                    .add(&spec, &devices, force)
                    .map_err(anyhow::Error::from)?;
                self.devices_changed(o, ctx)?;
                o.store.cache_devices_changed();
                o.store.sync().map_err(anyhow::Error::from)?;
                Ok(Response::Done {
                    message: spec
                        .all_devices()
                        .iter()
                        .map(|d| format!("added {d} to pool '{name}'"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                })
            }),
            R::PoolRemove { name, devices } => self.changing(ctx, &name, |o, ctx| {
                let mut lines = Vec::new();
                for d in &devices {
                    let (class, _) = o.pool.remove(d).map_err(anyhow::Error::from)?;
                    self.devices_changed(o, ctx)?;
                    o.store.cache_devices_changed();
                    lines.push(format!(
                        "removed {} device {d} from pool '{name}'",
                        class.section().unwrap_or("data")
                    ));
                }
                o.store.sync().map_err(anyhow::Error::from)?;
                Ok(Response::Done {
                    message: lines.join("\n"),
                })
            }),
            R::PoolGet { name } => {
                let o = self.open_pool(&name, ctx)?;
                let cfg = o.pool.config();
                let space = o.pool.space();
                let p = |property: &str, value: String, source: &str| PoolProp {
                    property: property.into(),
                    value,
                    source: source.into(),
                };
                Ok(Response::PoolProps(vec![
                    p("size", space.size.to_string(), "-"),
                    p("allocated", space.allocated.to_string(), "-"),
                    p("free", space.free.to_string(), "-"),
                    p("health", o.pool.state().to_string(), "-"),
                    p("guid", cfg.guid.to_string(), "-"),
                    p("ashift", cfg.ashift.to_string(), "local"),
                    p(
                        "autoreplace",
                        if cfg.autoreplace { "on" } else { "off" }.into(),
                        if cfg.autoreplace { "local" } else { "default" },
                    ),
                    p(
                        "multihost",
                        if cfg.multihost { "on" } else { "off" }.into(),
                        if cfg.multihost { "local" } else { "default" },
                    ),
                    p("hostid", format!("0x{:08x}", cfg.hostid), "-"),
                ]))
            }
            R::PoolSet {
                name,
                property,
                value,
            } => {
                if property != "autoreplace" && property != "multihost" {
                    return Err(ServiceError::Invalid(format!(
                        "cannot set '{property}': the settable pool properties are autoreplace and multihost (ashift is fixed at creation)"
                    )));
                }
                let on = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => {
                        return Err(ServiceError::Invalid(format!(
                            "bad value '{value}' for {property}: on or off"
                        )))
                    }
                };
                self.changing(ctx, &name, |o, ctx| {
                    if property == "multihost" {
                        o.pool.set_multihost(on).map_err(anyhow::Error::from)?;
                    } else {
                        o.pool.set_autoreplace(on).map_err(anyhow::Error::from)?;
                    }
                    o.pool.log_history(&ctx.command);
                    Ok(Response::Done {
                        message: format!("set {property}={value} on pool '{name}'"),
                    })
                })
            }
            _ => unreachable!("not a pool request"),
        }
    }

    /// Runs a change on an open pool under its lock.
    fn changing(
        &self,
        ctx: &mut Ctx,
        name: &str,
        f: impl FnOnce(&Opened, &mut Ctx) -> anyhow::Result<Response>,
    ) -> Res<Response> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let o = self.open_pool(name, ctx)?;
        Ok(f(&o, ctx)?)
    }

    fn names_or_all(&self, name: Option<String>) -> Res<Vec<String>> {
        Ok(match name {
            Some(n) => vec![n],
            None => self.pool_names()?,
        })
    }

    /// After a device change: the command goes in the history, the new device paths in
    /// the cache file.
    fn devices_changed(&self, o: &Opened, ctx: &Ctx) -> anyhow::Result<()> {
        o.pool.log_history(&ctx.command);
        let mut cache = PoolCache::load(self.data_dir())?;
        cache.upsert(cache_entry(&o.pool));
        cache.save(self.data_dir())?;
        Ok(())
    }

    fn scan_started(&self, pool: &str, done: Vec<String>, message: String) -> Response {
        Response::ScanStarted {
            pool: pool.to_string(),
            done,
            message,
            job: self.jobs.scan_of(self, pool),
        }
    }

    /// After devices came back: resilver what they missed (in the background).
    fn resilver_missed(&self, o: &Opened, mut done: Vec<String>) -> anyhow::Result<Response> {
        let name = o.pool.name();
        if !o.store.resilver_start()? {
            done.push("nothing to resilver: every device has every txg".into());
            return Ok(Response::Done {
                message: done.join("\n"),
            });
        }
        Ok(self.scan_started(
            &name,
            done,
            format!("resilver started; 'tank pool status {name}' shows its progress"),
        ))
    }

    fn pool_scrub(&self, ctx: &mut Ctx, name: &str, action: ScanAction) -> Res<Response> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let o = self.open_pool(name, ctx)?;
        let store = &o.store;
        match action {
            ScanAction::Stop => {
                store
                    .scrub_cancel()
                    .with_context(|| format!("cannot cancel scrubbing {name}"))?;
                Ok(Response::Done {
                    message: format!("scrub of pool '{name}' canceled"),
                })
            }
            ScanAction::Pause => {
                store
                    .scrub_pause()
                    .with_context(|| format!("cannot pause scrubbing {name}"))?;
                Ok(Response::Done {
                    message: format!(
                        "scrub of pool '{name}' paused; 'tank pool scrub {name}' resumes it"
                    ),
                })
            }
            ScanAction::Start => {
                let st = store.scan_status();
                if !self.is_daemon() && st.running && st.state.func == "scrub" {
                    // A scrub an earlier process left: resumed when this one opened the pool.
                    return Ok(self.scan_started(
                        name,
                        Vec::new(),
                        format!("resuming the scrub of pool '{name}'"),
                    ));
                }
                store
                    .scrub_start()
                    .with_context(|| format!("cannot scrub {name}"))?;
                Ok(self.scan_started(
                    name,
                    Vec::new(),
                    format!(
                        "scrub of pool '{name}' started; 'tank pool status {name}' shows its progress"
                    ),
                ))
            }
        }
    }

    fn pool_list(&self, ctx: &mut Ctx, names: Vec<String>) -> Res<Response> {
        let names = if names.is_empty() {
            self.pool_names()?
        } else {
            names
        };
        let mut out = Vec::new();
        for name in names {
            let o = self.open_pool(&name, ctx)?;
            let st = o.pool.status();
            let capacity = (st.space.allocated * 100)
                .checked_div(st.space.size)
                .unwrap_or(0);
            out.push(PoolSummary {
                name: st.name,
                guid: st.guid,
                size: st.space.size,
                allocated: st.space.allocated,
                free: st.space.free,
                capacity,
                health: st.state,
                ashift: o.pool.ashift(),
                txg: st.txg,
                usable: st.space.usable,
                fragmentation: st.space.fragmentation,
            });
        }
        Ok(Response::Pools(out))
    }

    /// The status of one open pool, with its scan and errors.
    pub fn report(&self, o: &Opened) -> PoolReport {
        let errors: Vec<String> = o
            .store
            .scan_errors()
            .into_iter()
            .map(|(tree, obj)| tank_dataset::error_name(&o.dsl, tree, obj))
            .collect();
        let mut scan = o.store.scan_status();
        let active = scan.state.phase == ScanPhase::Scanning && !scan.state.paused;
        let runner = match (active, self.is_daemon()) {
            (false, _) => None,
            (true, true) => Some("daemon".to_string()),
            (true, false) => {
                // This command's service runs it while it holds the pool, and stops it
                // when it closes.
                scan.running = false;
                Some("none".to_string())
            }
        };
        let mut status = o.pool.status();
        if !errors.is_empty() && status.suspended.is_none() {
            // As zpool status says it: permanent errors outrank a degraded pool and
            // errors that redundancy repaired.
            status.status = Some(
                "One or more devices has experienced an error resulting in data corruption. \
                 Applications may be affected."
                    .to_string(),
            );
            status.action = Some(
                "Restore the files in question from a backup or a snapshot if possible; \
                 otherwise restore the pool. The list below names them."
                    .to_string(),
            );
        }
        PoolReport {
            status,
            scan: ScanReport {
                status: scan,
                runner,
            },
            errors,
            import_notes: o.pool.import_notes.clone(),
        }
    }

    fn pool_status(&self, ctx: &mut Ctx, name: Option<String>) -> Res<Response> {
        let mut out = Vec::new();
        for n in self.names_or_all(name)? {
            let o = self.open_pool(&n, ctx)?;
            out.push(self.report(&o));
        }
        Ok(Response::PoolReports(out))
    }

    /// After create or import: records the command, opens the object sets, syncs, enters
    /// the pool in the cache file and keeps it open.
    fn register(&self, pool: &std::sync::Arc<Pool>, ctx: &Ctx) -> anyhow::Result<()> {
        pool.log_history(&ctx.command);
        let (store, dsl) = open_datasets(pool)?;
        store.sync()?;
        let mut cache = PoolCache::load(self.data_dir())?;
        cache.upsert(cache_entry(pool));
        cache.save(self.data_dir())?;
        self.adopt(Opened {
            pool: pool.clone(),
            store,
            dsl,
        });
        Ok(())
    }

    fn pool_create(
        &self,
        ctx: &mut Ctx,
        name: &str,
        spec: &[String],
        size: Option<u64>,
        force: bool,
        ashift: Option<u32>,
    ) -> Res<Response> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let cache = PoolCache::load(self.data_dir())?;
        if cache.find(name).is_some() {
            return Err(ServiceError::Exists(format!(
                "cannot create '{name}': a pool with that name is already imported"
            )));
        }
        let spec = PoolSpec::parse(spec, force).map_err(anyhow::Error::from)?;
        let devices = open_for_create(&spec.all_devices(), size)?;
        let opts = CreateOptions {
            ashift: ashift.unwrap_or(12),
            force,
            host: host_identity(self.data_dir())?,
            ..Default::default()
        };
        let (pool, warnings) =
            Pool::create(name, &spec, &devices, &opts).map_err(anyhow::Error::from)?;
        for w in warnings {
            ctx.note(format!("warning: {w}"));
        }
        self.register(&pool, ctx)?;
        Ok(Response::PoolCreated {
            status: Box::new(pool.status()),
        })
    }

    fn pool_import(
        &self,
        ctx: &mut Ctx,
        name: Option<String>,
        dirs: Vec<std::path::PathBuf>,
        rewind: bool,
        force: bool,
        missing_log: bool,
    ) -> Res<Response> {
        let dirs = if dirs.is_empty() {
            vec![self.data_dir().to_path_buf()]
        } else {
            dirs
        };
        let cache = PoolCache::load(self.data_dir())?;
        let Some(name) = name else {
            let (devs, _) = scan_dirs(&dirs, false)?;
            let found = Pool::scan(&devs)
                .into_iter()
                .filter(|c| cache.find(&c.guid.to_string()).is_none())
                .collect();
            return Ok(Response::ImportCandidates { pools: found });
        };
        let lock = self.pool_lock(&name);
        let _l = lock.lock();
        if cache.find(&name).is_some() {
            return Err(ServiceError::Exists(format!(
                "cannot import '{name}': a pool with that name is already imported"
            )));
        }
        // A member held by another process: that process has the pool, or is importing it
        // right now. Importing the members that are free would make a second, degraded copy
        // of the pool, so nothing is imported. Two imports racing may each hold some
        // members: both let go and try again after a random pause, until one has them all
        // (the other then finds the pool imported) or 3 s have passed.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let devs = loop {
            let (devs, busy) = scan_dirs(&dirs, true)?;
            let Some(path) = busy.iter().find(|p| member_of(p, &name)).cloned() else {
                break devs;
            };
            drop(devs);
            if std::time::Instant::now() > deadline {
                return Err(ServiceError::Busy(format!(
                    "cannot import '{name}': device {path} is in use by another process, which has imported the pool or is importing it"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(
                rand::random::<u64>() % 150 + 50,
            ));
        };
        let pool = Pool::import(
            &devs,
            &ImportOptions {
                name: Some(name.clone()),
                rewind,
                force,
                missing_log,
                host: host_identity(self.data_dir())?,
                ..Default::default()
            },
        )
        .map_err(anyhow::Error::from)?;
        for path in pool.autoreplace(&devs) {
            ctx.note(format!(
                "note: autoreplace: the blank device at {path} replaced the missing one"
            ));
        }
        drop(devs);
        for n in &pool.import_notes {
            ctx.note(format!("note: {n}"));
        }
        self.register(&pool, ctx)?;
        let st = pool.status();
        if self.is_daemon() {
            let o = self.pools.get(&st.name).expect("adopted");
            for line in self.mount_pool(&o) {
                ctx.note(line);
            }
            self.shares_back(&st.name);
        }
        Ok(Response::PoolImported {
            name: st.name,
            state: st.state,
        })
    }

    /// Mounts every filesystem of a pool that has a mountpoint; returns a line for each.
    pub fn mount_pool(&self, o: &Opened) -> Vec<String> {
        let list: Vec<(String, Option<std::path::PathBuf>)> = o
            .dsl
            .all_ids()
            .into_iter()
            .map(|id| (o.dsl.name_of(id), None))
            .collect();
        self.mounts.remount(&o.dsl, &o.store, &list)
    }

    fn pool_export(&self, ctx: &mut Ctx, name: &str) -> Res<Response> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let o = self.open_pool(name, ctx)?;
        self.mounts.unmount_pool(name)?;
        // Its shares stop being served (as `zpool export` unshares), until it is imported.
        self.mounts.handles().let_go_of_pool(name);
        // A suspended pool cannot write its export: it is let go as a crash would leave it,
        // and imported again once its devices are fixed (its intent log replays then).
        let abandoned = if o.pool.state() == "SUSPENDED" {
            let a = o.pool.abandon().map_err(anyhow::Error::from)?;
            if a {
                self.note_lost_uncommitted();
            }
            a
        } else {
            false
        };
        if !abandoned {
            o.pool.log_history(&ctx.command);
            if let Err(e) = o.pool.export() {
                // Still imported: its shares are served again.
                self.shares_back(name);
                return Err(anyhow::Error::from(e).into());
            }
        }
        self.pools.forget(name);
        let mut cache = PoolCache::load(self.data_dir())?;
        cache.remove(name);
        cache.save(self.data_dir())?;
        let message = if abandoned {
            format!(
                "exported suspended pool '{name}' without writing to it: what was not committed before it was suspended is lost; import it once its devices are fixed (what was committed, and its intent log, are kept)"
            )
        } else {
            format!("exported pool '{name}'")
        };
        Ok(Response::Done { message })
    }

    /// `pool clear` of a pool that is not suspended: the error counters, and faulted
    /// devices that still have their device brought back (then resilvered).
    fn clear_errors(
        &self,
        o: &Opened,
        ctx: &mut Ctx,
        name: &str,
        device: Option<String>,
    ) -> anyhow::Result<Response> {
        let back = o
            .pool
            .clear(device.as_deref())
            .map_err(anyhow::Error::from)?;
        o.pool.log_history(&ctx.command);
        let done: Vec<String> = back
            .iter()
            .map(|(dev, (first, last))| {
                format!("{dev} is back online; it missed txgs {first}..={last}")
            })
            .collect();
        if back.is_empty() {
            Ok(Response::Done {
                message: format!("cleared the errors of pool '{name}'"),
            })
        } else {
            self.resilver_missed(o, done)
        }
    }

    /// Pool `name` is open (again): the front ends are told of its shares.
    fn shares_back(&self, name: &str) {
        let pools: Vec<std::sync::Arc<tank_dataset::Dsl>> =
            self.open_pools().iter().map(|o| o.dsl.clone()).collect();
        self.shares.pool_back(&pools, name);
    }

    fn is_suspended(&self, name: &str, ctx: &mut Ctx) -> Res<bool> {
        Ok(self.open_pool(name, ctx)?.pool.state() == "SUSPENDED")
    }

    /// `pool clear` of a suspended pool: its devices fixed, it is let go as a crash would
    /// leave it (it cannot write) and opened again from them, at once: the last committed
    /// txg, then its intent log replayed, so that everything acknowledged as durable is
    /// there. What was written but neither committed nor logged (no fsync) before the pool
    /// was suspended is lost, as in a crash, and the message says so. OpenZFS retries the
    /// failed writes instead and keeps even that; this engine's sync does not resume
    /// midway, so the pool starts again from what is on its devices.
    fn resume_suspended(&self, ctx: &mut Ctx, name: &str) -> Res<Response> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let o = self.open_pool(name, ctx)?;
        if o.pool.state() != "SUSPENDED" {
            // Resumed meanwhile by another clear.
            return Ok(self.clear_errors(&o, ctx, name, None)?);
        }
        let reason = o.pool.status().suspended.unwrap_or_default();
        self.mounts.unmount_pool(name)?;
        self.mounts.handles().let_go_of_pool(name);
        let abandoned = o.pool.abandon().map_err(anyhow::Error::from)?;
        if abandoned {
            self.note_lost_uncommitted();
        }
        self.pools.forget(name);
        drop(o);
        // Opened again from the cache's devices, as the daemon does at its start.
        let o = self.open_pool(name, ctx).map_err(|e| {
            ServiceError::Failed(format!(
                "pool '{name}' was suspended ({reason}) and could not be opened again: {e}; fix its devices and run 'tank pool clear {name}' again, or import it"
            ))
        })?;
        o.pool.log_history(&ctx.command);
        if self.is_daemon() {
            for line in self.mount_pool(&o) {
                ctx.note(line);
            }
        }
        self.shares_back(name);
        let state = o.pool.state();
        if state == "SUSPENDED" {
            return Err(ServiceError::Failed(format!(
                "pool '{name}' was opened again and suspended at once: {}",
                o.pool.status().suspended.unwrap_or_default()
            )));
        }
        // A note as well as the reply: `pool clear` prints nothing of its own (as `zpool
        // clear`), but what was lost must be said.
        let message = format!(
            "pool '{name}' was suspended ({reason}); opened again from its devices ({state}): what was committed, and its intent log, are there; changes written but not committed or synced (no fsync) before it was suspended are lost"
        );
        ctx.note(format!("note: {message}"));
        Ok(Response::Done { message })
    }

    fn pool_destroy(&self, ctx: &mut Ctx, name: &str) -> Res<Response> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let o = self.open_pool(name, ctx)?;
        self.mounts.unmount_pool(name)?;
        self.mounts.handles().let_go_of_pool(name);
        if let Err(e) = o.pool.destroy() {
            self.shares_back(name);
            return Err(anyhow::Error::from(e).into());
        }
        self.pools.forget(name);
        let mut cache = PoolCache::load(self.data_dir())?;
        cache.remove(name);
        cache.save(self.data_dir())?;
        Ok(Response::Done {
            message: format!("destroyed pool '{name}'"),
        })
    }
}
