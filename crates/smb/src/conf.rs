//! The smb.conf tank generates: what each share option becomes.
//!
//! # Theory of operation
//! [`render`] is a pure function of the listener, tank's SMB directory and the shares (each
//! with the directory its dataset is mounted at), so the whole configuration can be checked
//! in a unit test and is rewritten whole (temporary file, rename) at each change. Nothing
//! of /etc/samba is read: `--configfile` names this file, and every directory Samba keeps
//! state in is under tank's. docs/SMB.md has the table of what each option becomes.

use std::fmt::Write;
use std::net::SocketAddr;
use std::path::Path;

/// One share as smbd serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareConf {
    pub name: String,
    /// Where the share's dataset is mounted.
    pub path: String,
    pub readonly: bool,
    pub browseable: bool,
    pub guest: bool,
    /// Accounts and groups (as `@group`) allowed; empty: every account.
    pub valid_users: Vec<String>,
    pub timemachine: bool,
    /// Time Machine's largest backup, in bytes.
    pub timemachine_max: Option<u64>,
    pub previous_versions: bool,
    pub comment: Option<String>,
}

/// A value for smb.conf: one line, without the characters that would end or break it.
fn clean(v: &str) -> String {
    v.chars()
        .filter(|c| !c.is_control() && *c != '[' && *c != ']')
        .collect()
}

/// smb.conf for `shares` served on `addr`, with Samba's state under `dir`; `mdns`: smbd
/// registers the server (and its Time Machine shares) with avahi-daemon.
pub fn render(addr: SocketAddr, dir: &Path, shares: &[ShareConf], mdns: bool) -> String {
    let d = dir.display();
    let mut s = String::new();
    let guest = shares.iter().any(|x| x.guest);
    // A wildcard address is every interface: Samba is given none to bind to (naming
    // 0.0.0.0 as an interface leaves it none at all).
    let bind = if addr.ip().is_unspecified() {
        "\tbind interfaces only = no\n".to_string()
    } else {
        format!(
            "\tinterfaces = {}\n\tbind interfaces only = yes\n",
            addr.ip()
        )
    };
    let _ = write!(
        s,
        "# Written by tank from its smb shares: changes here are overwritten.\n\
         [global]\n\
         \tserver role = standalone server\n\
         \tworkgroup = WORKGROUP\n\
         \tnetbios name = TANK\n\
         \tserver string = tank\n\
         \tsmb ports = {port}\n\
         {bind}\
         \tdisable netbios = yes\n\
         \tmulticast dns register = {mdns}\n\
         \tmdns name = mdns\n\
         \tserver min protocol = SMB2_10\n\
         \tsecurity = user\n\
         \tpassdb backend = smbpasswd:{d}/private/smbpasswd\n\
         \tprivate dir = {d}/private\n\
         \tlock directory = {d}/lock\n\
         \tstate directory = {d}/state\n\
         \tcache directory = {d}/cache\n\
         \tpid directory = {d}/run\n\
         \tncalrpc dir = {d}/run/ncalrpc\n\
         \tlog file = {d}/log/smbd.log\n\
         \tmax log size = 10000\n\
         \tlog level = 1\n\
         \tmap to guest = {map}\n\
         \tguest account = nobody\n\
         \trestrict anonymous = {anon}\n\
         \tload printers = no\n\
         \tprinting = bsd\n\
         \tprintcap name = /dev/null\n\
         \tdisable spoolss = yes\n\
         \tunix password sync = no\n\
         \tobey pam restrictions = no\n\
         \tusershare max shares = 0\n\
         \tregistry shares = no\n\
         \tea support = yes\n\
         \tstore dos attributes = yes\n\
         \tkernel oplocks = no\n\
         \tkernel share modes = no\n\
         \tsmb2 leases = yes\n\
         \tfruit:metadata = stream\n\
         \tfruit:copyfile = yes\n\
         \tfruit:zero_file_id = yes\n",
        port = addr.port(),
        bind = bind,
        map = if guest { "Bad User" } else { "Never" },
        anon = if guest { 0 } else { 2 },
        mdns = if mdns { "yes" } else { "no" },
    );
    for sh in shares {
        let mut vfs = vec!["catia", "fruit", "streams_xattr", "acl_xattr"];
        if sh.previous_versions {
            vfs.push("shadow_copy2");
        }
        let _ = write!(
            s,
            "\n[{name}]\n\
             \tpath = {path}\n\
             \tread only = {ro}\n\
             \tbrowseable = {browse}\n\
             \tguest ok = {guest}\n\
             \tvfs objects = {vfs}\n\
             \tacl_xattr:ignore system acls = yes\n\
             \tposix locking = yes\n\
             \tstrict sync = yes\n\
             \tsync always = no\n",
            name = clean(&sh.name),
            path = clean(&sh.path),
            ro = if sh.readonly { "yes" } else { "no" },
            browse = if sh.browseable { "yes" } else { "no" },
            guest = if sh.guest { "yes" } else { "no" },
            vfs = vfs.join(" "),
        );
        if let Some(c) = &sh.comment {
            let _ = writeln!(s, "\tcomment = {}", clean(c));
        }
        if !sh.valid_users.is_empty() {
            let users: Vec<String> = sh.valid_users.iter().map(|u| clean(u)).collect();
            let _ = writeln!(s, "\tvalid users = {}", users.join(" "));
        }
        if sh.timemachine {
            let _ = writeln!(s, "\tfruit:time machine = yes\n\tdurable handles = yes");
            if let Some(max) = sh.timemachine_max {
                let _ = writeln!(s, "\tfruit:time machine max size = {max}");
            }
        }
        if sh.previous_versions {
            // Snapshots are directories of `.tank/snapshot/`; those named by their UTC time
            // (`GMT-YYYY.MM.DD-HH.MM.SS`, the name Windows' Previous Versions gives a
            // version, without its `@`, which snapshot names cannot hold) are shown as the
            // share's earlier versions.
            let _ = writeln!(
                s,
                "\tshadow:snapdir = .tank/snapshot\n\
                 \tshadow:format = GMT-%Y.%m.%d-%H.%M.%S\n\
                 \tshadow:sort = desc\n\
                 \tshadow:localtime = no\n\
                 \tshadow:crossmountpoints = no"
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_become_sections_with_their_options() {
        let shares = vec![
            ShareConf {
                name: "media".into(),
                path: "/srv/tank/media".into(),
                readonly: true,
                browseable: true,
                guest: false,
                valid_users: vec!["alice".into(), "@staff".into()],
                timemachine: false,
                timemachine_max: None,
                previous_versions: true,
                comment: Some("films\n[evil]".into()),
            },
            ShareConf {
                name: "tm".into(),
                path: "/srv/tank/tm".into(),
                readonly: false,
                browseable: false,
                guest: true,
                valid_users: vec![],
                timemachine: true,
                timemachine_max: Some(1 << 40),
                previous_versions: false,
                comment: None,
            },
        ];
        let c = render(
            "127.0.0.1:4450".parse().unwrap(),
            Path::new("/d/smb"),
            &shares,
            false,
        );
        assert!(c.contains("multicast dns register = no\n"));
        assert!(c.contains("smb ports = 4450\n\tinterfaces = 127.0.0.1\n"));
        assert!(c.contains("passdb backend = smbpasswd:/d/smb/private/smbpasswd"));
        assert!(c.contains("map to guest = Bad User"));
        assert!(c.contains("[media]\n\tpath = /srv/tank/media\n\tread only = yes"));
        assert!(c.contains("valid users = alice @staff"));
        assert!(c.contains("vfs objects = catia fruit streams_xattr acl_xattr shadow_copy2"));
        assert!(
            c.contains("comment = filmsevil"),
            "a value stays on its line"
        );
        assert!(c.contains(
            "[tm]\n\tpath = /srv/tank/tm\n\tread only = no\n\tbrowseable = no\n\tguest ok = yes"
        ));
        assert!(c.contains("fruit:time machine = yes"));
        assert!(c.contains("fruit:time machine max size = 1099511627776"));
        assert!(!c.contains("/etc/samba"));
        let none = render("0.0.0.0:445".parse().unwrap(), Path::new("/d"), &[], true);
        assert!(none.contains("map to guest = Never"));
        assert!(none.contains("multicast dns register = yes\n\tmdns name = mdns\n"));
        assert!(none.contains("smb ports = 445\n\tbind interfaces only = no\n"));
        assert!(!none.contains("interfaces = 0.0.0.0"));
    }
}
