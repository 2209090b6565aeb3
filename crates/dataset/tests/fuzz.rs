//! The fuzz targets of `fuzz/` (docs/FUZZING.md), two ways:
//!
//! - every input a fuzzer ever found that crashed a target is kept in
//!   `fuzz/regressions/<target>/` and replayed here on every run, with no fuzzer needed;
//! - each target is built with cargo fuzz and run for a few seconds (a short, bounded
//!   campaign: the machine has two cores), when the nightly toolchain and cargo-fuzz are
//!   installed, as `.ci/run` does; elsewhere this says "skipped" with the reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// A target's entry point.
type Entry = fn(&[u8]);

/// Every target, by the name of its binary, with the function it feeds.
const TARGETS: &[(&str, Entry)] = &[
    ("blkptr", tank_block::fuzz::blkptr),
    ("gang_header", tank_block::fuzz::gang_header),
    ("space_map", tank_block::fuzz::space_map),
    ("label", tank_pool::fuzz::label),
    ("uberblock", tank_pool::fuzz::uberblock),
    ("root_block", tank_pool::fuzz::root_block),
    ("intent_log", tank_pool::fuzz::intent_log),
    ("tree_node", tank_object::fuzz::tree_node),
    ("object_header", tank_object::fuzz::object_header),
    ("log_record", tank_object::fuzz::log_record),
    ("l2arc_log_block", tank_object::fuzz::l2arc_log_block),
    ("dataset_records", tank_dataset::fuzz::dataset_records),
    ("posix_records", tank_dataset::fuzz::posix_records),
    ("send_stream", tank_dataset::fuzz::send_stream),
    ("pool_image", tank_object::fuzz::pool_image),
];

/// Seconds each target is fuzzed for in the bounded campaign.
const SECONDS: u32 = 5;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn skip(test: &str, why: &str) {
    use std::io::Write as _;
    let line = format!("{test}: skipped: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

#[test]
fn every_target_is_listed_in_the_fuzz_crate() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for (name, _) in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} missing from fuzz/Cargo.toml"
        );
        assert!(fuzz_dir().join(format!("fuzz_targets/{name}.rs")).exists());
    }
    let bins = manifest.matches("[[bin]]").count();
    assert_eq!(
        bins,
        TARGETS.len(),
        "a target of fuzz/ is not replayed here"
    );
}

#[test]
fn inputs_that_once_crashed_a_target_are_handled() {
    let mut replayed = 0;
    for (name, run) in TARGETS {
        let dir = fuzz_dir().join("regressions").join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            eprintln!("{name}: {}", path.display());
            run(&data);
            replayed += 1;
        }
    }
    eprintln!("{replayed} regression inputs replayed");
    // Also the degenerate inputs, every target.
    for (_, run) in TARGETS {
        for data in [&[][..], &[0u8; 1], &[0xff; 600], &[0u8; 4096]] {
            run(data);
        }
    }
}

/// Runs `cargo +nightly fuzz ...` in `fuzz/`; None when it cannot start.
fn cargo_fuzz(args: &[&str]) -> Option<std::process::Output> {
    Command::new("cargo")
        .arg("+nightly")
        .arg("fuzz")
        .args(args)
        .current_dir(fuzz_dir())
        // The campaign builds with its own flags, in its own target directory (below).
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .output()
        .ok()
}

/// Where the campaign builds: beside the suite's own build when that is kept outside the
/// repository (`CARGO_TARGET_DIR`, as `.ci/run` sets it), so that a machine that keeps it
/// warm does not build the targets from nothing each run; else cargo fuzz's own directory
/// inside `fuzz/`.
fn fuzz_target_dir() -> Option<String> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")?;
    Some(Path::new(&dir).join("fuzz").to_string_lossy().into_owned())
}

#[test]
fn each_target_survives_a_short_fuzzing_campaign() {
    let test = "each_target_survives_a_short_fuzzing_campaign";
    match cargo_fuzz(&["--version"]) {
        Some(o) if o.status.success() => {}
        _ => {
            skip(test, "cargo fuzz or the nightly toolchain is not installed");
            return;
        }
    }
    // No sanitizer (the code under test is safe Rust; the coverage is what matters), with
    // debug assertions, so an arithmetic overflow is a crash.
    let target_dir = fuzz_target_dir();
    let mut flags = vec!["-s", "none", "-a", "-O"];
    if let Some(t) = &target_dir {
        flags.extend(["--target-dir", t.as_str()]);
    }
    let started = Instant::now();
    let mut build = vec!["build"];
    build.extend(&flags);
    let out = cargo_fuzz(&build).expect("cargo fuzz build");
    assert!(
        out.status.success(),
        "cargo fuzz build failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("built in {:.0} s", started.elapsed().as_secs_f64());
    // Two targets at a time (each fuzzer is one process on one core; the machine has two).
    let time = format!("-max_total_time={SECONDS}");
    let next = std::sync::atomic::AtomicUsize::new(0);
    let report = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((name, _)) = TARGETS.get(i) else {
                        return;
                    };
                    let mut run = vec!["run"];
                    run.extend(&flags);
                    run.extend([
                        name,
                        "--",
                        &time,
                        "-rss_limit_mb=2048",
                        "-print_final_stats=1",
                    ]);
                    let line = campaign(name, &cargo_fuzz(&run).expect("cargo fuzz run"));
                    report.lock().unwrap().push(line);
                })
            })
            .collect();
        for w in workers {
            if let Err(panic) = w.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
    let mut report = report.into_inner().unwrap();
    report.sort();
    assert_eq!(report.len(), TARGETS.len());
    eprintln!("{}", report.join("\n"));
}

/// Checks one target's campaign: no crash, inputs run. Its line of the report.
fn campaign(name: &str, out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name}: the fuzzer found a crash (saved under fuzz/artifacts/{name}/; add it to \
         fuzz/regressions/{name}/ once fixed):\n{}",
        err.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let stat = |key: &str| {
        err.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim_start_matches(':').trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let execs = stat("stat::number_of_executed_units");
    // The last status line's "cov: N".
    let cov = err
        .lines()
        .rev()
        .find_map(|l| l.split("cov: ").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(execs > 0, "{name}: no input was run:\n{err}");
    format!("{name}: {execs} executions, coverage {cov}")
}
