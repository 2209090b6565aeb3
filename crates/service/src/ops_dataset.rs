//! Dataset requests: list, create, set, inherit, rename, destroy, snapshot, rollback,
//! clone, mount and unmount (the zfs vocabulary); and the benchmark of a mounted filesystem
//! as a job.
//!
//! # Theory of operation
//! Each request runs one dataset-directory task on the pool its dataset names, under the
//! pool's lock when it changes something, and logs the change in the pool history. The
//! policy around mounted filesystems lives here, as zfs has it: a rollback unmounts the
//! filesystem and mounts it again after; a destroy unmounts what it destroys and mounts it
//! again if the destroy fails; a new filesystem (create, clone) is mounted at its
//! mountpoint by the daemon. Listings return the datasets with every property's value and
//! source; the client picks and formats the columns.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;

use tank_dataset::{DatasetKind, Dsl, Op};

use crate::api::{BenchParams, MountInfo, Request, Response};
use crate::error::ServiceError;
use crate::mounts::pool_of;
use crate::pools::Opened;
use crate::service::{Ctx, Res, Service};

impl Service {
    /// Runs `f` on the pool that `name` belongs to, under its lock, logging the command in
    /// the pool history when it succeeds.
    fn on_pool<T>(
        &self,
        ctx: &mut Ctx,
        name: &str,
        f: impl FnOnce(&Opened, &mut Ctx) -> anyhow::Result<T>,
    ) -> Res<T> {
        let lock = self.pool_lock(name);
        let _l = lock.lock();
        let o = self.open_pool(pool_of(name), ctx)?;
        let r = f(&o, ctx)?;
        o.pool.log_history(&ctx.command);
        Ok(r)
    }

    /// Mounts new filesystems at their mountpoints (the daemon only: a command's own
    /// service mounts nothing that would end with it).
    fn mount_new(&self, o: &Opened, ctx: &mut Ctx, names: Vec<String>) {
        if !self.is_daemon() {
            return;
        }
        let list: Vec<(String, Option<PathBuf>)> = names.into_iter().map(|n| (n, None)).collect();
        for line in self.mounts.remount(&o.dsl, &o.store, &list) {
            ctx.note(line);
        }
    }

    /// A destroy as a job: the checks and the unmounts now, then each dataset of the tree
    /// (deepest first, with its snapshots) in a sync task of its own on a worker thread,
    /// the job counting the bytes each one held.
    fn destroy_in_background(
        &self,
        ctx: &mut Ctx,
        name: String,
        recursive: bool,
        dependents: bool,
        force: bool,
    ) -> Res<Response> {
        if name.contains('@') {
            return Err(ServiceError::Invalid(
                "a snapshot is destroyed at once; background destroys are for datasets".into(),
            ));
        }
        let (o, total, steps) = self.on_pool(ctx, &name, |o, _| {
            let root = o.dsl.resolve(&name)?;
            let mut steps: Vec<(String, u64)> = Vec::new();
            for id in o.dsl.subtree(root) {
                let rec = o.dsl.record(id)?;
                if rec.kind == DatasetKind::Snapshot {
                    continue;
                }
                let info = o.dsl.info(id)?;
                let own = |p: &str| {
                    info.prop(p)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                steps.push((
                    o.dsl.name_of(id),
                    own("usedbydataset") + own("usedbysnapshots"),
                ));
            }
            if steps.len() > 1 && !recursive {
                bail!(ServiceError::Busy(format!(
                    "cannot destroy '{name}': it has children; destroy them too (recursive)"
                )));
            }
            let was = self.mounts.unmount_tree_with(&name, force)?;
            self.mounts
                .handles()
                .before_destroy(&o.dsl.pool_name(), &name, force)?;
            self.mounts.remove_mount_dirs(&was);
            // Deepest first: a parent goes after its children.
            steps.sort_by_key(|(n, _)| std::cmp::Reverse(n.matches('/').count()));
            let total = steps.iter().map(|(_, b)| b).sum::<u64>();
            Ok((o.clone(), total, steps))
        })?;
        let progress = crate::jobs::Progress::new("destroy", &name, total);
        let id = self.jobs.start(progress.clone());
        let lock = self.pool_lock(&name);
        let command = ctx.command.clone();
        std::thread::Builder::new()
            .name("tank-destroy".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                let (mut done, mut count) = (0u64, 0usize);
                let n = steps.len();
                for (i, (ds, bytes)) in steps.into_iter().enumerate() {
                    if progress.canceled() {
                        o.pool.log_history(&command);
                        progress.end(Err(format!(
                            "stopped before '{ds}': {count} datasets and snapshots destroyed"
                        )));
                        return;
                    }
                    let r = {
                        let _l = lock.lock();
                        o.dsl.run(Op::Destroy {
                            name: ds.clone(),
                            recursive: true,
                            dependents,
                        })
                    };
                    match r {
                        Ok(gone) => count += gone.len(),
                        Err(e) => {
                            progress.end(Err(format!(
                                "cannot destroy '{ds}': {e} ({count} datasets and snapshots destroyed before)"
                            )));
                            return;
                        }
                    }
                    done += bytes;
                    progress.advance(
                        done,
                        started.elapsed(),
                        format!("destroyed {ds} ({} of {n} datasets)", i + 1),
                    );
                }
                o.pool.log_history(&command);
                progress.end(Ok(format!(
                    "destroyed {count} datasets and snapshots in {:.1} s",
                    started.elapsed().as_secs_f64()
                )));
            })
            .map_err(|e| ServiceError::Failed(format!("cannot start the destroy: {e}")))?;
        Ok(Response::JobStarted {
            job: id,
            message: format!("destroying '{name}' in the background: job {id}"),
        })
    }

    /// A benchmark of a mounted filesystem as a job: the dataset held for it (so that a
    /// destroy is refused while it runs, and a forced one stops it), the runner on a
    /// worker thread, its figures kept with the job.
    fn bench(&self, ctx: &mut Ctx, dataset: String, params: BenchParams) -> Res<Response> {
        let runner = self
            .benchmark()
            .ok_or_else(|| ServiceError::Invalid("this service has no benchmark runner".into()))?;
        let o = self.open_pool(pool_of(&dataset), ctx)?;
        let kind = o
            .dsl
            .resolve(&dataset)
            .and_then(|id| o.dsl.record(id))
            .map_err(|e| {
                ServiceError::from_anyhow(
                    &anyhow::Error::new(e).context(format!("cannot benchmark '{dataset}'")),
                )
            })?
            .kind;
        if kind != DatasetKind::Filesystem {
            return Err(ServiceError::Invalid(format!(
                "cannot benchmark '{dataset}': only a mounted filesystem can be benchmarked"
            )));
        }
        let dir = self
            .mounts
            .list()
            .into_iter()
            .find(|m| m.dataset == dataset)
            .map(|m| m.dir)
            .ok_or_else(|| {
                ServiceError::Invalid(format!(
                    "cannot benchmark '{dataset}': it is not mounted (tank mount {dataset})"
                ))
            })?;
        let progress = crate::jobs::Progress::new("benchmark", &dataset, 0);
        let stopper = Arc::new(StopOnDestroy(progress.clone()));
        let hold = self.hold(&dataset, "benchmark", stopper)?;
        let label = params.label.clone().unwrap_or_else(|| dataset.clone());
        let job = self.bench_job(progress, label, move |progress| {
            let r = runner.run(&dir, &params, progress);
            drop(hold);
            r
        })?;
        Ok(Response::JobStarted {
            job,
            message: format!("benchmarking '{dataset}' in the background: job {job}"),
        })
    }

    /// A benchmark of an emulated build as a job: the build checked before the job starts
    /// (its grammar, and no other emulated build being measured), then made, measured and
    /// removed by the runner on a worker thread.
    fn emulated_bench(&self, build: String, params: BenchParams) -> Res<Response> {
        let runner = self
            .benchmark()
            .ok_or_else(|| ServiceError::Invalid("this service has no benchmark runner".into()))?;
        runner
            .check_build(&build)
            .map_err(|why| ServiceError::Invalid(format!("cannot benchmark '{build}': {why}")))?;
        let target = format!("emulated {build}");
        let progress = crate::jobs::Progress::new("benchmark", &target, 0);
        let label = params.label.clone().unwrap_or_else(|| target.clone());
        let data_dir = self.data_dir().to_path_buf();
        let job = self.bench_job(progress, label, move |progress| {
            runner.run_emulated(&data_dir, &build, &params, progress)
        })?;
        Ok(Response::JobStarted {
            job,
            message: format!("benchmarking the {target} build in the background: job {job}"),
        })
    }

    /// Starts a benchmark job: `run` on a worker thread, its figures (named `label`) kept
    /// with the job and appended to the benchmark history when it finishes.
    fn bench_job(
        &self,
        progress: Arc<crate::jobs::Progress>,
        label: String,
        run: impl FnOnce(&crate::jobs::Progress) -> Result<(String, serde_json::Value), String>
            + Send
            + 'static,
    ) -> Res<u64> {
        let job = self.jobs.start(progress.clone());
        let history = self.data_dir().join(crate::service::BENCH_HISTORY);
        std::thread::Builder::new()
            .name("tank-bench".into())
            .spawn(move || match run(&progress) {
                Ok((summary, mut figures)) => {
                    // Into the history, named, for `tank bench --compare` and the console's
                    // charts; a failure to write it is the job's note.
                    if let Some(m) = figures.as_object_mut() {
                        m.insert("label".into(), label.into());
                    }
                    let note = match crate::service::append_history(&history, &figures) {
                        Ok(()) => String::new(),
                        Err(e) => format!(" (not kept in the history: {e})"),
                    };
                    progress.finish(format!("{summary}{note}"), figures)
                }
                Err(why) => progress.end(Err(why)),
            })
            .map_err(|e| ServiceError::Failed(format!("cannot start the benchmark: {e}")))?;
        Ok(job)
    }

    pub(crate) fn dataset_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        use Request as R;
        match req {
            R::DatasetList {
                names,
                recursive,
                types,
            } => {
                let pools: Vec<String> = if names.is_empty() {
                    self.pool_names()?
                } else {
                    let mut p: Vec<String> = names.iter().map(|n| pool_of(n).to_string()).collect();
                    p.dedup();
                    p
                };
                let mut out = Vec::new();
                for pool in pools {
                    let o = self.open_pool(&pool, ctx)?;
                    let wanted: Vec<&String> =
                        names.iter().filter(|n| pool_of(n) == pool).collect();
                    let ids: Vec<u64> = if wanted.is_empty() {
                        o.dsl.all_ids()
                    } else {
                        let mut ids = Vec::new();
                        for n in wanted {
                            let id = o.dsl.resolve(n).map_err(anyhow::Error::from)?;
                            if recursive {
                                ids.extend(o.dsl.subtree(id));
                            } else {
                                ids.push(id);
                            }
                        }
                        ids
                    };
                    let named = !names.is_empty() && !recursive;
                    for id in ids {
                        // The kind is in the record: a kind not asked for costs no
                        // property computation.
                        if !types.is_empty() && !named {
                            let kind = o.dsl.record(id).map_err(anyhow::Error::from)?.kind;
                            if !types.contains(&kind) {
                                continue;
                            }
                        }
                        out.push(o.dsl.info(id).map_err(anyhow::Error::from)?);
                    }
                }
                Ok(Response::Datasets { datasets: out })
            }
            R::DatasetCreate {
                name,
                kind,
                props,
                parents,
            } => {
                if kind == DatasetKind::Snapshot {
                    return Err(ServiceError::Invalid(
                        "a snapshot is taken with the snapshot request, not created".into(),
                    ));
                }
                // Mounted under the pool's lock too: a destroy of the parent waiting for the
                // lock then finds the new mount in the table and unmounts it first.
                let names = self.on_pool(ctx, &name, |o, ctx| {
                    let created = o.dsl.run(Op::Create {
                        name: name.clone(),
                        kind,
                        props,
                        parents,
                    })?;
                    let names: Vec<String> = created.iter().map(|id| o.dsl.name_of(*id)).collect();
                    self.mount_new(o, ctx, names.clone());
                    Ok(names)
                })?;
                Ok(Response::DatasetNames(names))
            }
            R::DatasetSet { name, props } => self.on_pool(ctx, &name, |o, _| {
                let names: Vec<String> = props.iter().map(|(k, _)| k.clone()).collect();
                o.dsl.run(Op::SetProps {
                    name: name.clone(),
                    props: props.into_iter().map(|(k, v)| (k, Some(v))).collect(),
                })?;
                if let Ok(id) = o.dsl.resolve(&name) {
                    self.mounts.handles().properties_changed(&o.dsl, id, names);
                }
                Ok(Response::Done {
                    message: format!("set properties of '{name}'"),
                })
            }),
            R::DatasetInherit {
                name,
                property,
                recursive,
            } => self.on_pool(ctx, &name, |o, _| {
                let d: &Dsl = &o.dsl;
                let root = d.resolve(&name)?;
                let targets = if recursive {
                    d.subtree(root)
                } else {
                    vec![root]
                };
                for id in targets {
                    let rec = d.record(id)?;
                    if rec.kind == DatasetKind::Snapshot
                        || (id != root && !rec.props.contains_key(&property))
                    {
                        continue;
                    }
                    d.run(Op::SetProps {
                        name: d.name_of(id),
                        props: vec![(property.clone(), None)],
                    })?;
                    self.mounts
                        .handles()
                        .properties_changed(d, id, vec![property.clone()]);
                }
                Ok(Response::Done {
                    message: format!("'{property}' of '{name}' is inherited"),
                })
            }),
            R::DatasetRename { from, to } => {
                if pool_of(&to) != pool_of(&from) {
                    return Err(ServiceError::Invalid(format!(
                        "cannot rename '{from}' to '{to}': datasets cannot move to another pool"
                    )));
                }
                self.on_pool(ctx, &from, |o, _| {
                    o.dsl.run(Op::Rename {
                        from: from.clone(),
                        to: to.clone(),
                    })?;
                    self.mounts.renamed(&from, &to);
                    self.mounts
                        .handles()
                        .renamed(&o.dsl.pool_name(), &from, &to);
                    Ok(Response::Done {
                        message: format!("renamed '{from}' to '{to}'"),
                    })
                })
            }
            R::DatasetDestroy { name, .. } if name.contains('#') => {
                self.on_pool(ctx, &name, |o, _| {
                    o.dsl.run(Op::DestroyBookmark {
                        bookmark: name.clone(),
                    })?;
                    Ok(Response::Destroyed { count: 1 })
                })
            }
            R::DatasetDestroy {
                name,
                recursive,
                dependents,
                force,
                background: true,
            } => self.destroy_in_background(ctx, name, recursive, dependents, force),
            R::DatasetBench { dataset, params } => self.bench(ctx, dataset, params),
            R::EmulatedBench { build, params } => self.emulated_bench(build, params),
            R::DatasetDestroy {
                name,
                recursive,
                dependents,
                force,
                background: false,
            } => self.on_pool(ctx, &name, |o, _| {
                // Forced, as `zfs destroy -f`: busy mounts too (their open files fail).
                let was = if name.contains('@') {
                    Vec::new()
                } else {
                    self.mounts.unmount_tree_with(&name, force)?
                };
                // Other front ends that serve it: refused unless forced, as zfs destroy
                // refuses a busy dataset.
                let result = if name.contains('@') {
                    Ok(())
                } else {
                    self.mounts
                        .handles()
                        .before_destroy(&o.dsl.pool_name(), &name, force)
                };
                let result = result.map_err(anyhow::Error::from).and_then(|()| {
                    Ok(o.dsl.run(Op::Destroy {
                        name: name.clone(),
                        recursive: recursive || dependents,
                        dependents,
                    })?)
                });
                match result {
                    Ok(gone) => {
                        self.mounts.remove_mount_dirs(&was);
                        Ok(Response::Destroyed { count: gone.len() })
                    }
                    Err(e) => {
                        let back: Vec<_> = was.into_iter().map(|(n, d)| (n, Some(d))).collect();
                        self.mounts.remount(&o.dsl, &o.store, &back);
                        Err(e)
                    }
                }
            }),
            R::Snapshot { names, recursive } => {
                let Some(first) = names.first() else {
                    return Err(ServiceError::Invalid("no snapshot named".into()));
                };
                let pool = pool_of(first).to_string();
                if let Some(other) = names.iter().find(|n| pool_of(n) != pool) {
                    return Err(ServiceError::Invalid(format!(
                        "cannot snapshot '{other}': all snapshots of one command must be in one pool"
                    )));
                }
                self.on_pool(ctx, &pool, |o, _| {
                    o.dsl.run(Op::Snapshot {
                        names: names.clone(),
                        recursive,
                    })?;
                    Ok(Response::DatasetNames(names))
                })
            }
            R::Rollback {
                snapshot,
                destroy_later,
            } => self.on_pool(ctx, &snapshot, |o, ctx| {
                let dataset = snapshot.split('@').next().unwrap_or_default();
                // As zfs: the filesystem is unmounted for the rollback and mounted again.
                let was: Vec<_> = self
                    .mounts
                    .unmount_tree(dataset)?
                    .into_iter()
                    .map(|(n, d)| (n, Some(d)))
                    .collect();
                // Every other front end that holds it lets go while it is rolled back.
                let id = o.dsl.resolve(dataset)?;
                let result = self.mounts.handles().suspended(
                    &o.dsl,
                    id,
                    &format!("rollback to {snapshot}"),
                    || {
                        o.dsl.run(Op::Rollback {
                            snapshot: snapshot.clone(),
                            destroy_later,
                        })
                    },
                )?;
                for line in self.mounts.remount(&o.dsl, &o.store, &was) {
                    ctx.note(line);
                }
                result?;
                Ok(Response::Done {
                    message: format!("rolled '{dataset}' back to '{snapshot}'"),
                })
            }),
            R::Clone {
                snapshot,
                target,
                props,
            } => {
                if pool_of(&target) != pool_of(&snapshot) {
                    return Err(ServiceError::Invalid(format!(
                        "cannot clone '{snapshot}' to '{target}': a clone stays in its snapshot's pool"
                    )));
                }
                self.on_pool(ctx, &snapshot, |o, ctx| {
                    o.dsl.run(Op::Clone {
                        snapshot: snapshot.clone(),
                        target: target.clone(),
                        props,
                    })?;
                    self.mount_new(o, ctx, vec![target.clone()]);
                    Ok(())
                })?;
                Ok(Response::DatasetNames(vec![target]))
            }
            R::Mount { dataset, dir } => {
                let o = self.open_pool(pool_of(&dataset), ctx)?;
                let (dir, uring) = self
                    .mounts
                    .mount(&o.dsl, &o.store, &dataset, dir.as_deref())?;
                if uring {
                    ctx.note("requests come over io_uring");
                }
                Ok(Response::Mounted(MountInfo { dataset, dir }))
            }
            R::Unmount { target } => match self.mounts.unmount(&target) {
                Some(r) => {
                    let dir = r?;
                    Ok(Response::Done {
                        message: format!("unmounted {}", dir.display()),
                    })
                }
                None => Err(ServiceError::NotFound(format!(
                    "cannot unmount '{target}': this service has not mounted it"
                ))),
            },
            R::MountList => Ok(Response::Mounts(self.mounts.list())),
            _ => unreachable!("not a dataset request"),
        }
    }
}

/// A benchmark's hold: a forced destroy of its dataset stops it.
struct StopOnDestroy(Arc<crate::jobs::Progress>);

impl crate::handles::Holder for StopOnDestroy {
    fn notify(&self, event: &crate::handles::DatasetEvent) {
        if matches!(event, crate::handles::DatasetEvent::Destroying) {
            self.0.request_cancel();
        }
    }
}
