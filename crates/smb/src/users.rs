//! tank's accounts as Samba sees them.
//!
//! # Theory of operation
//! Samba knows users by the system's user database and checks passwords against its
//! passdb. tank's accounts are neither system users nor in /etc/passwd, and must not be:
//! so smbd runs with `nss_wrapper` (the cwrap library Samba's own tests use), which answers
//! its user and group lookups from two files of tank's, and with the `smbpasswd` passdb, a
//! file of tank's too. All three are rendered from the account store ([`render`]) and
//! written whole, each through a temporary file and a rename, at start and after every
//! committed change of the store: a password change counts at the next login.
//!
//! Each account is its own uid and primary gid, the numbers the filesystems store, so the
//! files a user writes through SMB have the owner they have through the local mount, NFS
//! and S3. An account without an NT hash (made before tank kept one, or without a password)
//! cannot log in over SMB until its password is set again.

use std::fmt::Write;
use std::path::Path;

use tank_service::accounts::{Group, User};

/// The three files: passwd, group, smbpasswd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    pub passwd: String,
    pub group: String,
    pub smbpasswd: String,
}

/// A name that can stand in these files (tank's names already can; this keeps a bad one
/// from breaking a line).
fn ok_name(n: &str) -> bool {
    !n.is_empty() && !n.contains([':', '\n', ',', ' '])
}

/// The files for `users` and `groups`.
pub fn render(users: &[User], groups: &[Group]) -> Files {
    let mut passwd = String::from(
        "root:x:0:0:root:/root:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    );
    let mut group = String::from("root:x:0:\nnogroup:x:65534:\n");
    let mut smbpasswd = String::new();
    let mut gids: Vec<u32> = vec![0, 65534];
    for g in groups.iter().filter(|g| ok_name(&g.name)) {
        if gids.contains(&g.gid) {
            continue;
        }
        gids.push(g.gid);
        let members: Vec<&str> = g
            .members
            .iter()
            .map(String::as_str)
            .filter(|m| ok_name(m))
            .collect();
        let _ = writeln!(group, "{}:x:{}:{}", g.name, g.gid, members.join(","));
    }
    for u in users.iter().filter(|u| ok_name(&u.name)) {
        if u.uid == 0 || u.uid == 65534 {
            continue;
        }
        let _ = writeln!(
            passwd,
            "{}:x:{}:{}:tank account:/nonexistent:/bin/false",
            u.name, u.uid, u.gid
        );
        if !gids.contains(&u.gid) {
            // A primary group that is no tank group (100, `users`, by default).
            gids.push(u.gid);
            let name = if u.gid == 100 {
                "users".to_string()
            } else {
                format!("g{}", u.gid)
            };
            let _ = writeln!(group, "{name}:x:{}:", u.gid);
        }
        if let Some(nt) = u
            .nt_hash
            .as_deref()
            .filter(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            let _ = writeln!(
                smbpasswd,
                "{}:{}:XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX:{}:[U          ]:LCT-{:08X}:",
                u.name,
                u.uid,
                nt.to_ascii_uppercase(),
                u.created as u32
            );
        }
    }
    Files {
        passwd,
        group,
        smbpasswd,
    }
}

/// Writes `text` to `path` whole: a temporary file beside it, synced, renamed over it.
pub fn write_whole(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, uid: u32, gid: u32, nt: Option<&str>) -> User {
        User {
            name: name.into(),
            uid,
            gid,
            admin: false,
            s3_bucket_create: false,
            password: None,
            nt_hash: nt.map(str::to_string),
            chap_secret: None,
            created: 0x1234,
        }
    }

    #[test]
    fn accounts_become_nss_and_smbpasswd_lines() {
        let users = vec![
            user(
                "alice",
                1000,
                1500,
                Some("8846f7eaee8fb117ad06bdd830b7586c"),
            ),
            user("bob", 1001, 100, None),
            user("bad:name", 1002, 100, Some("00")),
        ];
        let groups = vec![Group {
            name: "staff".into(),
            gid: 1500,
            members: vec!["alice".into(), "bob".into()],
        }];
        let f = render(&users, &groups);
        assert!(f
            .passwd
            .contains("alice:x:1000:1500:tank account:/nonexistent:/bin/false\n"));
        assert!(f.passwd.contains("bob:x:1001:100:"));
        assert!(!f.passwd.contains("bad:name"));
        assert!(f.group.contains("staff:x:1500:alice,bob\n"));
        assert!(f.group.contains("users:x:100:\n"));
        assert_eq!(
            f.smbpasswd,
            "alice:1000:XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX:8846F7EAEE8FB117AD06BDD830B7586C:[U          ]:LCT-00001234:\n",
            "bob has no NT hash yet: no line"
        );
    }
}
