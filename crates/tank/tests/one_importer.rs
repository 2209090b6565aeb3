//! One importer: two `tank` processes with their own data directories race to import the
//! same file devices; exactly one gets the pool, the other says why. Then the pool, left
//! imported by one, is refused to the other without -f.

mod common;

use std::process::Command;

use common::Env;

fn import(env: &Env, data: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(["pool", "import", "-d", "disks", "sh"])
        .env("TANK_DATA_DIR", env.path(data))
        .current_dir(env.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn in_data(env: &Env, data: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tank"))
        .args(args)
        .env("TANK_DATA_DIR", env.path(data))
        .current_dir(env.dir.path())
        .output()
        .unwrap()
}

#[test]
fn two_data_directories_racing_to_import_one_pool() {
    let env = Env::new();
    for data in ["a", "b"] {
        std::fs::create_dir_all(env.path(data)).unwrap();
    }
    let create = in_data(
        &env,
        "a",
        &[
            "pool", "create", "--size", "96M", "sh", "raidz1", "disks/x0", "disks/x1", "disks/x2",
        ],
    );
    assert!(create.status.success(), "{create:?}");
    let set = in_data(&env, "a", &["pool", "set", "multihost=on", "sh"]);
    assert!(set.status.success(), "{set:?}");
    let get = in_data(&env, "a", &["pool", "get", "multihost,hostid", "sh"]);
    let get_out = String::from_utf8_lossy(&get.stdout);
    assert!(
        get_out.contains("multihost") && get_out.contains("on"),
        "{get_out}"
    );
    assert!(
        get_out.contains("hostid") && get_out.contains("0x"),
        "{get_out}"
    );
    assert!(in_data(&env, "a", &["pool", "export", "sh"])
        .status
        .success());

    let mut holder = None;
    for round in 0..3 {
        let racers = [import(&env, "a"), import(&env, "b")];
        let outs: Vec<_> = racers
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let won: Vec<usize> = (0..2).filter(|&i| outs[i].status.success()).collect();
        assert_eq!(
            won.len(),
            1,
            "round {round}: exactly one data directory imports the pool: {outs:?}"
        );
        let (winner, loser) = (won[0], 1 - won[0]);
        let why = String::from_utf8_lossy(&outs[loser].stderr).into_owned();
        assert!(
            why.contains("in use by another process")
                || why.contains("in use by another tank instance")
                || why.contains("being imported by")
                || why.contains("imported on host"),
            "round {round}: {why}"
        );
        assert!(!why.contains("panicked"), "{why}");
        let (w, l) = (["a", "b"][winner], ["a", "b"][loser]);
        let list = |data: &str| {
            let out = in_data(&env, data, &["pool", "list", "-H", "-o", "name,health"]);
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        // The winner has the whole pool: never a degraded copy made of the members the
        // other process left free.
        assert_eq!(list(w).trim(), "sh\tONLINE", "round {round}");
        assert!(!list(l).contains("sh"), "round {round}");
        eprintln!(
            "round {round}: '{w}' imported the pool; '{l}' was told: {}",
            why.trim()
        );
        if round < 2 {
            assert!(in_data(&env, w, &["pool", "export", "sh"]).status.success());
        } else {
            // The -f take-over below watches a pool active elsewhere for 20 heartbeat
            // intervals with multihost on (the pool tests cover that); off, it is at once.
            let off = in_data(&env, w, &["pool", "set", "multihost=off", "sh"]);
            assert!(off.status.success(), "{off:?}");
            holder = Some((w, l));
        }
    }
    // Left imported (not exported) by one data directory: the other is refused without -f,
    // and takes it with -f (the first one's next open is then refused in turn).
    let (w, l) = holder.unwrap();
    let out = in_data(&env, l, &["pool", "import", "-d", "disks", "sh"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("in use by another tank instance on this host") && err.contains("-f"),
        "{err}"
    );
    let out = in_data(&env, l, &["pool", "import", "-f", "-d", "disks", "sh"]);
    assert!(out.status.success(), "{out:?}");
    let out = in_data(&env, w, &["pool", "status", "sh"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("another tank instance"), "{err}");
}
