//! `tank user`, `tank group`, `tank key`, `tank token`: the accounts of the management service
//! (`tank_service::accounts`), kept in `DATA_DIR/accounts.redb`.
//!
//! # Theory of operation
//! With a daemon running, these commands go to it (it holds the store open) and are
//! authorized there for the caller the socket names (SO_PEERCRED, `daemon.rs`); without one,
//! the command opens the store itself, which only its owner (the file is mode 0600) can.
//! A password comes from standard input (one line) or `--password-file`, read by the client
//! and sent beside the command, never on a command line.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_service::{Accounts, NewUser};

use crate::datadir::data_dir;

#[derive(Subcommand)]
pub enum UserCmd {
    /// Add a user; its password is read from standard input (or --password-file).
    Add(UserAddArgs),
    /// Change a user's password (read from standard input, or --password-file).
    Passwd(PasswdArgs),
    /// Change a user's settings: uid=N, admin=on|off, group=G (the primary group).
    Set(UserSetArgs),
    /// List the users.
    List(ListArgs),
    /// Remove a user, with its keys, tokens and group memberships.
    Remove(NameArg),
    /// Write every account (password hashes, keys and tokens included) as JSON, for backup.
    Export(FileArg),
    /// Replace every account with those of a file written by 'user export'.
    Import(FileArg),
}

#[derive(Subcommand)]
pub enum GroupCmd {
    /// Add a group.
    Add(GroupAddArgs),
    /// List the groups and their members.
    List(ListArgs),
    /// Remove a group (not while it is a user's primary group).
    Remove(NameArg),
    /// Add a user to a group, or remove it.
    #[command(subcommand)]
    Member(MemberCmd),
}

#[derive(Subcommand)]
pub enum MemberCmd {
    Add(MemberArgs),
    Remove(MemberArgs),
}

#[derive(Subcommand)]
pub enum KeyCmd {
    /// Make an S3 access key for a user: prints "access_key: ..." and "secret_key: ...".
    Add(NameArg),
    /// List access keys (of one user, or all).
    List(KeyListArgs),
    /// Revoke an access key.
    Remove(KeyArg),
}

#[derive(Subcommand)]
pub enum TokenCmd {
    /// Make an API token for a user: prints "token: ..." (shown once).
    Add(NameArg),
    /// List API tokens (of one user, or all); their secrets are not kept.
    List(KeyListArgs),
    /// Revoke an API token by its id.
    Remove(KeyArg),
}

#[derive(Args)]
pub struct UserAddArgs {
    pub name: String,
    /// The uid (default: the first free from 1000).
    #[arg(long)]
    pub uid: Option<u32>,
    /// A group the user belongs to (repeatable; the first is its primary group).
    #[arg(long = "group")]
    pub groups: Vec<String>,
    /// An administrator: may do everything.
    #[arg(long)]
    pub admin: bool,
    /// Read the password from this file's first line instead of standard input.
    #[arg(long)]
    pub password_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct PasswdArgs {
    pub name: String,
    #[arg(long)]
    pub password_file: Option<PathBuf>,
}

#[derive(Args)]
pub struct UserSetArgs {
    pub name: String,
    /// KEY=VALUE settings.
    #[arg(required = true)]
    pub settings: Vec<String>,
}

#[derive(Args)]
pub struct ListArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct NameArg {
    pub name: String,
}

#[derive(Args)]
pub struct FileArg {
    pub file: PathBuf,
}

#[derive(Args)]
pub struct GroupAddArgs {
    pub name: String,
    #[arg(long)]
    pub gid: Option<u32>,
}

#[derive(Args)]
pub struct MemberArgs {
    pub group: String,
    pub user: String,
}

#[derive(Args)]
pub struct KeyListArgs {
    pub user: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct KeyArg {
    pub id: String,
}

/// The daemon's store, open for its life.
static DAEMON_ACCOUNTS: OnceLock<Arc<Accounts>> = OnceLock::new();

thread_local! {
    /// A secret (password) the client sent beside its command, for the daemon's thread
    /// running it.
    static SECRET: RefCell<Option<String>> = const { RefCell::new(None) };
}

pub fn accounts_path() -> PathBuf {
    data_dir().join("accounts.redb")
}

/// Opens the daemon's store at start (creating it).
pub fn open_for_daemon() -> Result<Arc<Accounts>> {
    let accounts = Arc::new(Accounts::open(&accounts_path()).with_context(|| {
        format!(
            "cannot open the account store {}",
            accounts_path().display()
        )
    })?);
    let _ = DAEMON_ACCOUNTS.set(accounts.clone());
    Ok(accounts)
}

/// The store: the daemon's, or opened for this command.
pub fn accounts() -> Result<Arc<Accounts>> {
    if let Some(a) = DAEMON_ACCOUNTS.get() {
        return Ok(a.clone());
    }
    std::fs::create_dir_all(data_dir()).ok();
    Ok(Arc::new(Accounts::open(&accounts_path()).with_context(
        || {
            format!(
                "cannot open the account store {}",
                accounts_path().display()
            )
        },
    )?))
}

/// Runs `f` with the secret a client sent (daemon side).
pub fn with_secret<R>(secret: Option<String>, f: impl FnOnce() -> R) -> R {
    SECRET.with(|s| *s.borrow_mut() = secret);
    let r = f();
    SECRET.with(|s| *s.borrow_mut() = None);
    r
}

/// Whether a command line (without the program name) carries a password, and from where;
/// the client reads it before sending the command to the daemon.
pub fn secret_source(argv: &[String]) -> Option<Option<PathBuf>> {
    let wants = matches!(
        argv.iter().map(String::as_str).take(2).collect::<Vec<_>>()[..],
        ["user", "add"] | ["user", "passwd"]
    );
    if !wants {
        return None;
    }
    let file = argv
        .iter()
        .position(|a| a == "--password-file")
        .and_then(|i| argv.get(i + 1))
        .map(PathBuf::from)
        .or_else(|| {
            argv.iter()
                .find_map(|a| a.strip_prefix("--password-file="))
                .map(PathBuf::from)
        });
    Some(file)
}

/// Reads a password: the first line of `file`, or of standard input.
pub fn read_secret(file: Option<&std::path::Path>) -> Result<String> {
    let raw = match file {
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read the password file {}", f.display()))?,
        None => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the password from standard input")?;
            line
        }
    };
    let pw = raw.lines().next().unwrap_or("").to_string();
    if pw.is_empty() {
        bail!("no password given (one line on standard input, or --password-file FILE)");
    }
    Ok(pw)
}

fn password(file: Option<&std::path::Path>) -> Result<String> {
    if let Some(s) = SECRET.with(|s| s.borrow().clone()) {
        return Ok(s);
    }
    read_secret(file)
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.to_vec());
    t
}

pub fn run_user(c: UserCmd) -> Result<()> {
    let a = accounts()?;
    match c {
        UserCmd::Add(x) => {
            let pw = password(x.password_file.as_deref())?;
            let u = a.add_user(NewUser {
                name: x.name,
                uid: x.uid,
                groups: x.groups,
                admin: x.admin,
                password: Some(pw),
            })?;
            outln!(
                "added user '{}' (uid {}, gid {}{})",
                u.name,
                u.uid,
                u.gid,
                if u.admin { ", administrator" } else { "" }
            );
        }
        UserCmd::Passwd(x) => {
            let pw = password(x.password_file.as_deref())?;
            a.set_password(&x.name, &pw)?;
            outln!("password of '{}' changed", x.name);
        }
        UserCmd::Set(x) => {
            for s in &x.settings {
                let Some((k, v)) = s.split_once('=') else {
                    bail!("expected KEY=VALUE, got '{s}'");
                };
                a.set_user(&x.name, k, v)?;
            }
            outln!("user '{}' updated", x.name);
        }
        UserCmd::List(l) => {
            let users = a.users()?;
            let groups = a.groups()?;
            if l.json {
                let v: Vec<serde_json::Value> = users
                    .iter()
                    .map(|u| {
                        let member: Vec<&str> = groups
                            .iter()
                            .filter(|g| g.members.contains(&u.name))
                            .map(|g| g.name.as_str())
                            .collect();
                        serde_json::json!({
                            "name": u.name, "uid": u.uid, "gid": u.gid, "admin": u.admin,
                            "password": u.has_password(), "groups": member, "created": u.created,
                        })
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = table(&["NAME", "UID", "GID", "ROLE", "GROUPS"]);
                for u in &users {
                    let member: Vec<&str> = groups
                        .iter()
                        .filter(|g| g.members.contains(&u.name))
                        .map(|g| g.name.as_str())
                        .collect();
                    t.add_row(vec![
                        u.name.clone(),
                        u.uid.to_string(),
                        u.gid.to_string(),
                        if u.admin { "admin" } else { "user" }.into(),
                        member.join(","),
                    ]);
                }
                outln!("{t}");
            }
        }
        UserCmd::Remove(n) => {
            a.remove_user(&n.name)?;
            outln!(
                "removed user '{}' (its keys and tokens are revoked)",
                n.name
            );
        }
        UserCmd::Export(f) => {
            let file = crate::out::resolve(&f.file);
            let data = serde_json::to_vec_pretty(&a.export()?)?;
            write_private(&file, &data)?;
            outln!("accounts written to {}", file.display());
        }
        UserCmd::Import(f) => {
            let file = crate::out::resolve(&f.file);
            let raw =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let data: tank_service::Export = serde_json::from_slice(&raw)
                .with_context(|| format!("{} is not an account export", file.display()))?;
            a.import(&data)?;
            outln!(
                "accounts replaced from {}: {} users, {} groups, {} keys, {} tokens",
                file.display(),
                data.users.len(),
                data.groups.len(),
                data.keys.len(),
                data.tokens.len()
            );
        }
    }
    Ok(())
}

/// Writes `data` to a new file only its owner can read (it holds hashes and secrets).
fn write_private(path: &std::path::Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {} (it must not exist)", path.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    Ok(())
}

pub fn run_group(c: GroupCmd) -> Result<()> {
    let a = accounts()?;
    match c {
        GroupCmd::Add(x) => {
            let g = a.add_group(&x.name, x.gid)?;
            outln!("added group '{}' (gid {})", g.name, g.gid);
        }
        GroupCmd::List(l) => {
            let groups = a.groups()?;
            if l.json {
                outln!("{}", serde_json::to_string_pretty(&groups)?);
            } else {
                let mut t = table(&["NAME", "GID", "MEMBERS"]);
                for g in &groups {
                    t.add_row(vec![g.name.clone(), g.gid.to_string(), g.members.join(",")]);
                }
                outln!("{t}");
            }
        }
        GroupCmd::Remove(n) => {
            a.remove_group(&n.name)?;
            outln!("removed group '{}'", n.name);
        }
        GroupCmd::Member(MemberCmd::Add(m)) => {
            a.set_member(&m.group, &m.user, true)?;
            outln!("'{}' is a member of '{}'", m.user, m.group);
        }
        GroupCmd::Member(MemberCmd::Remove(m)) => {
            a.set_member(&m.group, &m.user, false)?;
            outln!("'{}' is no longer a member of '{}'", m.user, m.group);
        }
    }
    Ok(())
}

pub fn run_key(c: KeyCmd) -> Result<()> {
    let a = accounts()?;
    match c {
        KeyCmd::Add(n) => {
            let k = a.add_key(&n.name)?;
            outln!("access_key: {}", k.access_key);
            outln!("secret_key: {}", k.secret_key);
        }
        KeyCmd::List(l) => {
            let keys = a.keys(l.user.as_deref())?;
            if l.json {
                let v: Vec<serde_json::Value> = keys
                    .iter()
                    .map(|k| {
                        serde_json::json!({
                            "access_key": k.access_key, "user": k.user, "created": k.created
                        })
                    })
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = table(&["ACCESS KEY", "USER", "CREATED"]);
                for k in &keys {
                    t.add_row(vec![
                        k.access_key.clone(),
                        k.user.clone(),
                        tank_pool::fmt_time(k.created),
                    ]);
                }
                outln!("{t}");
            }
        }
        KeyCmd::Remove(k) => {
            let key = a.remove_key(&k.id)?;
            outln!("access key {} of '{}' revoked", key.access_key, key.user);
        }
    }
    Ok(())
}

pub fn run_token(c: TokenCmd) -> Result<()> {
    let a = accounts()?;
    match c {
        TokenCmd::Add(n) => {
            let (_, token) = a.add_token(&n.name)?;
            outln!("token: {token}");
        }
        TokenCmd::List(l) => {
            let tokens = a.tokens(l.user.as_deref())?;
            if l.json {
                let v: Vec<serde_json::Value> = tokens
                    .iter()
                    .map(|t| serde_json::json!({"id": t.id, "user": t.user, "created": t.created}))
                    .collect();
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let mut t = table(&["ID", "USER", "CREATED"]);
                for k in &tokens {
                    t.add_row(vec![
                        k.id.clone(),
                        k.user.clone(),
                        tank_pool::fmt_time(k.created),
                    ]);
                }
                outln!("{t}");
            }
        }
        TokenCmd::Remove(k) => {
            let t = a.remove_token(&k.id)?;
            outln!("token {} of '{}' revoked", t.id, t.user);
        }
    }
    Ok(())
}

/// What a command line (without the program name) needs of its caller, for the daemon's
/// check (`tank_service::authorize`): reading the state is open to every user; a user's own
/// password, keys and tokens to that user; everything else to administrators.
pub fn access_of(argv: &[String], accounts: &Accounts) -> tank_service::Access {
    use tank_service::Access;
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    let flags_only = |rest: &[&str]| rest.iter().all(|w| w.starts_with('-'));
    let owner_of_key = |id: &str| {
        accounts
            .key(id)
            .ok()
            .flatten()
            .map(|k| k.user)
            .or_else(|| accounts.token(id).ok().flatten().map(|t| t.user))
    };
    match words.as_slice() {
        ["user", "passwd", name, ..] | ["key", "add", name] | ["token", "add", name] => {
            Access::Account(name.to_string())
        }
        ["key" | "token", "list", name, ..] if !name.starts_with('-') => {
            Access::Account(name.to_string())
        }
        ["key" | "token", "remove", id] => match owner_of_key(id) {
            Some(owner) => Access::Account(owner),
            None => Access::Admin,
        },
        ["pool", "list" | "status" | "iostat" | "history" | "get", ..]
        | ["dataset", "list" | "get", ..]
        | ["share", "list", ..]
        | ["arcstat", ..] => Access::Read,
        ["pool", "events", rest @ ..] if !rest.iter().any(|w| *w == "-c" || *w == "--clear") => {
            Access::Read
        }
        ["param", rest @ ..] if flags_only(rest) => Access::Read,
        _ => Access::Admin,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tank_service::Access;

    #[test]
    fn each_command_line_needs_its_access() {
        let dir = tempfile::tempdir().unwrap();
        let a = Accounts::open(&dir.path().join("a.redb")).unwrap();
        a.add_user(NewUser {
            name: "alice".into(),
            ..NewUser::default()
        })
        .unwrap();
        let key = a.add_key("alice").unwrap().access_key;
        let (token, _) = a.add_token("alice").unwrap();
        let need = |line: &str| {
            let argv: Vec<String> = line.split_whitespace().map(String::from).collect();
            access_of(&argv, &a)
        };
        let own = Access::Account("alice".into());
        for line in [
            "pool list",
            "pool status -v tank",
            "pool events tank",
            "pool iostat -v tank 1 2",
            "pool history tank",
            "pool get all tank",
            "dataset list -r",
            "dataset get all tank/a",
            "share list --json",
            "arcstat",
            "param",
        ] {
            assert_eq!(need(line), Access::Read, "{line}");
        }
        for line in [
            "user passwd alice",
            "key add alice",
            "key list alice",
            "token add alice",
            "token list alice --json",
        ] {
            assert_eq!(need(line), own, "{line}");
        }
        assert_eq!(need(&format!("key remove {key}")), own);
        assert_eq!(need(&format!("token remove {}", token.id)), own);
        for line in [
            "pool create tank mirror a b",
            "pool events -c tank",
            "pool scrub tank",
            "pool destroy tank",
            "dataset create tank/a",
            "dataset set quota=1G tank/a",
            "snapshot tank@s",
            "rollback tank@s",
            "mount tank",
            "debug label /dev/sda",
            "param arc_max=1G",
            "user list",
            "user add bob",
            "user set alice admin=on",
            "user export f",
            "group add staff",
            "key list",
            "key remove TKNOSUCHKEY",
            "share add smb s tank/a",
            "share remove s",
        ] {
            assert_eq!(need(line), Access::Admin, "{line}");
        }
    }
}
