//! `tank user`, `tank group`, `tank key`, `tank token`: the accounts of the management service
//! (`tank_service::accounts`), kept in `DATA_DIR/accounts.redb`.
//!
//! # Theory of operation
//! Each command is a typed request to the service (`client.rs`). With a daemon running it
//! holds the store open and authorizes each request for the caller the socket names
//! (SO_PEERCRED); without one, the command's own service opens the store, which only its
//! owner (the file is mode 0600) can. A password comes from standard input (one line) or
//! `--password-file`, read here and sent in the request, never on a command line.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets, Table};
use tank_service::api::{Request, Response};

use crate::client::{call, unexpected};

#[derive(Subcommand)]
pub enum UserCmd {
    /// Add a user; its password is read from standard input (or --password-file).
    Add(UserAddArgs),
    /// Change a user's password (read from standard input, or --password-file).
    Passwd(PasswdArgs),
    /// Change a user's settings: uid=N, admin=on|off, group=G (the primary group),
    /// s3_bucket_create=on|off (may create buckets through S3), chap_secret=SECRET (the
    /// user's iSCSI CHAP secret, 12 to 255 characters; chap_secret=- reads it from standard
    /// input, chap_secret= removes it).
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

/// Reads a password: the first line of `file`, or of standard input.
pub fn read_secret(file: Option<&std::path::Path>) -> Result<String> {
    let raw = match file {
        Some(f) => {
            let f = crate::out::resolve(f);
            std::fs::read_to_string(&f)
                .with_context(|| format!("cannot read the password file {}", f.display()))?
        }
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

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_header(header.to_vec());
    t
}

/// Sends a change and prints what it answers.
fn done(req: Request) -> Result<()> {
    match call(req)? {
        Response::Done { message } => outln!("{message}"),
        r => return Err(unexpected(r)),
    }
    Ok(())
}

pub fn run_user(c: UserCmd) -> Result<()> {
    match c {
        UserCmd::Add(x) => {
            let password = read_secret(x.password_file.as_deref())?;
            let u = match call(Request::UserAdd {
                name: x.name,
                uid: x.uid,
                groups: x.groups,
                admin: x.admin,
                password: Some(password),
            })? {
                Response::User(u) => u,
                r => return Err(unexpected(r)),
            };
            outln!(
                "added user '{}' (uid {}, gid {}{})",
                u.name,
                u.uid,
                u.gid,
                if u.admin { ", administrator" } else { "" }
            );
        }
        UserCmd::Passwd(x) => {
            let password = read_secret(x.password_file.as_deref())?;
            done(Request::UserPasswd {
                name: x.name,
                password,
            })?;
        }
        UserCmd::Set(x) => {
            let mut settings = crate::out::pairs(&x.settings)?;
            for (k, v) in settings.iter_mut() {
                if k == "chap_secret" && v == "-" {
                    *v = read_secret(None)?;
                }
            }
            let name = x.name.clone();
            call(Request::UserSet {
                name: x.name,
                settings,
            })?;
            outln!("user '{name}' updated");
        }
        UserCmd::List(l) => {
            let users = match call(Request::UserList)? {
                Response::Users(u) => u,
                r => return Err(unexpected(r)),
            };
            if l.json {
                outln!("{}", serde_json::to_string_pretty(&users)?);
            } else {
                let mut t = table(&["NAME", "UID", "GID", "ROLE", "GROUPS"]);
                for u in &users {
                    t.add_row(vec![
                        u.name.clone(),
                        u.uid.to_string(),
                        u.gid.to_string(),
                        if u.admin { "admin" } else { "user" }.into(),
                        u.groups.join(","),
                    ]);
                }
                outln!("{t}");
            }
        }
        UserCmd::Remove(n) => done(Request::UserRemove { name: n.name })?,
        UserCmd::Export(f) => {
            let file = crate::out::resolve(&f.file);
            let data = match call(Request::AccountsExport)? {
                Response::Accounts { accounts } => accounts,
                r => return Err(unexpected(r)),
            };
            write_private(&file, &serde_json::to_vec_pretty(&data)?)?;
            outln!("accounts written to {}", file.display());
        }
        UserCmd::Import(f) => {
            let file = crate::out::resolve(&f.file);
            let raw =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let data: tank_service::Export = serde_json::from_slice(&raw)
                .with_context(|| format!("{} is not an account export", file.display()))?;
            match call(Request::AccountsImport { data })? {
                Response::Done { message } => {
                    outln!("accounts replaced from {}: {message}", file.display())
                }
                r => return Err(unexpected(r)),
            }
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
    match c {
        GroupCmd::Add(x) => match call(Request::GroupAdd {
            name: x.name,
            gid: x.gid,
        })? {
            Response::Groups(g) if g.len() == 1 => {
                outln!("added group '{}' (gid {})", g[0].name, g[0].gid)
            }
            r => return Err(unexpected(r)),
        },
        GroupCmd::List(l) => {
            let groups = match call(Request::GroupList)? {
                Response::Groups(g) => g,
                r => return Err(unexpected(r)),
            };
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
        GroupCmd::Remove(n) => done(Request::GroupRemove { name: n.name })?,
        GroupCmd::Member(MemberCmd::Add(m)) => done(Request::GroupMember {
            group: m.group,
            user: m.user,
            add: true,
        })?,
        GroupCmd::Member(MemberCmd::Remove(m)) => done(Request::GroupMember {
            group: m.group,
            user: m.user,
            add: false,
        })?,
    }
    Ok(())
}

pub fn run_key(c: KeyCmd) -> Result<()> {
    match c {
        KeyCmd::Add(n) => match call(Request::KeyAdd { user: n.name })? {
            Response::Key(k) => {
                outln!("access_key: {}", k.access_key);
                outln!("secret_key: {}", k.secret_key);
            }
            r => return Err(unexpected(r)),
        },
        KeyCmd::List(l) => {
            let keys = match call(Request::KeyList { user: l.user })? {
                Response::Keys(k) => k,
                r => return Err(unexpected(r)),
            };
            if l.json {
                outln!("{}", serde_json::to_string_pretty(&keys)?);
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
        KeyCmd::Remove(k) => done(Request::KeyRemove { access_key: k.id })?,
    }
    Ok(())
}

pub fn run_token(c: TokenCmd) -> Result<()> {
    match c {
        TokenCmd::Add(n) => match call(Request::TokenAdd { user: n.name })? {
            Response::Token(t) => outln!("token: {}", t.token),
            r => return Err(unexpected(r)),
        },
        TokenCmd::List(l) => {
            let tokens = match call(Request::TokenList { user: l.user })? {
                Response::Tokens(t) => t,
                r => return Err(unexpected(r)),
            };
            if l.json {
                outln!("{}", serde_json::to_string_pretty(&tokens)?);
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
        TokenCmd::Remove(k) => done(Request::TokenRemove { id: k.id })?,
    }
    Ok(())
}
