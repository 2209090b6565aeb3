//! Accounts: local users and groups, S3 access keys and API tokens.
//!
//! # Theory of operation
//! One redb database (`DATA_DIR/accounts.redb`, created mode 0600), one table per kind, keyed
//! by user name, group name, access key id or token id, each value a JSON record. Every change
//! is one write transaction committed with fsync (redb's default durability) before the call
//! returns, so a crash leaves the store as it was before the change or after it, never in
//! between; a change that fails a check changes nothing.
//!
//! - **Passwords** are kept as argon2id PHC strings (the argon2 crate's defaults: 19 MiB,
//!   2 passes), never as the password or a fast hash.
//! - **S3 secret keys** are kept as they are: checking a SigV4 signature needs the secret
//!   itself, as in every S3 server; the file's mode keeps them to the daemon's user.
//! - **API tokens** read `tank_<id>_<secret>`, 256 random bits of secret; the store keeps
//!   only the SHA-256 of the secret (a fast hash is safe for a random secret of that size,
//!   unlike for a password), so the token is shown once, when it is made.
//! - **uid and gid numbers** are the ones the filesystems store. Given, or the first free
//!   from 1000 up, as useradd does. A user's primary group is the first group it was given;
//!   without one, gid 100 (`users`).
//!
//! Removing a user removes its keys, its tokens and its group memberships in the same
//! transaction: a revoked key or token stops working at once.

use std::path::Path;

use argon2::password_hash::phc::PasswordHash;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use argon2::Argon2;
use rand::RngCore;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::error::ServiceError;

type Res<T> = Result<T, ServiceError>;

const USERS: TableDefinition<&str, &[u8]> = TableDefinition::new("users");
const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("groups");
const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("s3_keys");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("api_tokens");
/// The daemon's other settings, each a JSON record by name: S3 remotes (their keys are
/// secrets, as the S3 keys above are) and replication tasks with their state.
pub const REMOTES: TableDefinition<&str, &[u8]> = TableDefinition::new("remotes");
pub const REPLICATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("replications");
/// Backup uploads under way (their multipart upload ids), by remote, bucket and object.
pub const UPLOADS: TableDefinition<&str, &[u8]> = TableDefinition::new("uploads");

/// First uid and gid given when none is asked for (as useradd's UID_MIN).
pub const FIRST_ID: u32 = 1000;
/// The primary gid of a user given no group (`users`).
pub const USERS_GID: u32 = 100;
/// Highest uid or gid accepted (below nobody's 65534 and the 2^32-1 "no id").
pub const MAX_ID: u32 = 4_294_967_294;
/// The version of [`Export`].
pub const EXPORT_VERSION: u32 = 1;
/// Length of an access key id (AWS's are 20 characters, `AKIA...`).
const ACCESS_KEY_LEN: usize = 20;
/// Length of a secret key (AWS's are 40 characters).
const SECRET_KEY_LEN: usize = 40;

/// A local user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct User {
    pub name: String,
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Administrator (everything) or user (its own account; what is shared with it).
    pub admin: bool,
    /// May create buckets through S3 (CreateBucket makes a dataset under the S3 parent).
    #[serde(default)]
    pub s3_bucket_create: bool,
    /// argon2id PHC string; None: no password (cannot log in with one).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub password: Option<String>,
    /// The NT hash of the password (MD4 of its UTF-16LE form, hex), which SMB's NTLM
    /// authentication needs: kept for Samba's password file, never shown.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub nt_hash: Option<String>,
    /// The user's iSCSI CHAP secret. CHAP proves knowledge of the secret itself, so it is
    /// kept as it is (like an S3 secret key), never shown; it is not the password.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub chap_secret: Option<String>,
    /// Seconds since 1970.
    pub created: u64,
}

impl User {
    /// The record without its password hash, as listings show it.
    pub fn public(&self) -> User {
        User {
            password: None,
            nt_hash: None,
            chap_secret: None,
            ..self.clone()
        }
    }

    pub fn has_password(&self) -> bool {
        self.password.is_some()
    }
}

/// A local group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Group {
    pub name: String,
    pub gid: u32,
    /// User names, sorted.
    pub members: Vec<String>,
}

/// An S3 access key of a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AccessKey {
    pub access_key: String,
    pub secret_key: String,
    pub user: String,
    pub created: u64,
}

/// An API token of a user (its secret is not kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Token {
    pub id: String,
    /// SHA-256 of the secret part, hex.
    pub hash: String,
    pub user: String,
    pub created: u64,
}

/// What `user add` asks for.
#[derive(Debug, Clone, Default)]
pub struct NewUser {
    pub name: String,
    pub uid: Option<u32>,
    /// Group names; the first is the primary group.
    pub groups: Vec<String>,
    pub admin: bool,
    pub password: Option<String>,
}

/// Every account, for backup (`tank user export`) and restore (`tank user import`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    pub version: u32,
    pub users: Vec<User>,
    pub groups: Vec<Group>,
    pub keys: Vec<AccessKey>,
    pub tokens: Vec<Token>,
}

/// The account store.
pub struct Accounts {
    db: Database,
    /// Bumped at every committed change (what the SMB front end follows to keep Samba's
    /// user and password files in step).
    generation: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts").finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A user or group name: a lowercase letter or `_`, then up to 31 lowercase letters, digits,
/// `_`, `-` or `.` (the portable subset useradd accepts).
pub fn validate_name(kind: &str, name: &str) -> Res<()> {
    let ok_first = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let ok_rest = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c));
    if !ok_first || !ok_rest || name.len() > 32 {
        return Err(ServiceError::Invalid(format!(
            "invalid {kind} name '{name}': a lowercase letter or '_', then up to 31 lowercase letters, digits, '_', '-' or '.'"
        )));
    }
    Ok(())
}

fn check_id(kind: &str, id: u32) -> Res<()> {
    if id == 0 || id > MAX_ID {
        return Err(ServiceError::Invalid(format!(
            "invalid {kind} {id}: from 1 to {MAX_ID} (0 is root's)"
        )));
    }
    Ok(())
}

/// A password: 8 to 1024 bytes (NIST SP 800-63B's floor), no NUL.
fn check_password(password: &str) -> Res<()> {
    if password.len() < 8 || password.len() > 1024 || password.contains('\0') {
        return Err(ServiceError::Invalid(
            "a password has 8 to 1024 characters and no NUL".into(),
        ));
    }
    Ok(())
}

/// The NT hash of a password (MD4 of its UTF-16LE form), as Samba keeps it.
pub fn nt_hash(password: &str) -> String {
    use md4::{Digest, Md4};
    let utf16: Vec<u8> = password.encode_utf16().flat_map(u16::to_le_bytes).collect();
    Md4::digest(&utf16)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect()
}

fn hash_password(password: &str) -> Res<String> {
    check_password(password)?;
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| ServiceError::Store(format!("cannot hash the password: {e}")))
}

fn random_string(len: usize, alphabet: &[u8]) -> String {
    let mut rng = rand::rngs::OsRng;
    let mut out = String::with_capacity(len);
    // Rejection sampling keeps every character equally likely.
    let limit = 256 - 256 % alphabet.len();
    while out.len() < len {
        let mut b = [0u8; 64];
        rng.fill_bytes(&mut b);
        for &x in &b {
            if (x as usize) < limit && out.len() < len {
                out.push(alphabet[x as usize % alphabet.len()] as char);
            }
        }
    }
    out
}

const UPPER_DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const TOKEN_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn sha256_hex(s: &str) -> String {
    let d = sha2::Sha256::digest(s.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("account records serialize")
}

fn from_json<T: for<'a> Deserialize<'a>>(what: &str, raw: &[u8]) -> Res<T> {
    serde_json::from_slice(raw)
        .map_err(|e| ServiceError::Store(format!("damaged {what} record: {e}")))
}

/// Reads every record of `table` in a read or write transaction.
macro_rules! all_of {
    ($txn:expr, $table:expr, $ty:ty, $what:expr) => {{
        let table = $txn.open_table($table)?;
        let mut out: Vec<$ty> = Vec::new();
        for row in table.iter()? {
            let (_, v) = row?;
            out.push(from_json($what, v.value())?);
        }
        out
    }};
}

impl Accounts {
    /// Commits a change, and counts it.
    fn committed(&self, txn: redb::WriteTransaction) -> Res<()> {
        txn.commit()?;
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// How many changes were committed through this handle: a follower re-reads the store
    /// when it moves.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Opens the store at `path`, creating it (mode 0600) and its tables when missing.
    pub fn open(path: &Path) -> Res<Accounts> {
        if !path.exists() {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| {
                    ServiceError::Store(format!("cannot create {}: {e}", path.display()))
                })?;
        }
        let db = Database::create(path)
            .map_err(|e| ServiceError::Store(format!("cannot open {}: {e}", path.display())))?;
        let txn = db.begin_write()?;
        for t in [USERS, GROUPS, KEYS, TOKENS, REMOTES, REPLICATIONS, UPLOADS] {
            txn.open_table(t)?;
        }
        txn.commit()?;
        Ok(Accounts {
            db,
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    // ---- users ----

    pub fn add_user(&self, new: NewUser) -> Res<User> {
        validate_name("user", &new.name)?;
        let password = new.password.as_deref().map(hash_password).transpose()?;
        let txn = self.db.begin_write()?;
        let user = {
            let users: Vec<User> = all_of!(txn, USERS, User, "user");
            let mut groups: Vec<Group> = all_of!(txn, GROUPS, Group, "group");
            if users.iter().any(|u| u.name == new.name) {
                return Err(ServiceError::Exists(format!("user '{}' exists", new.name)));
            }
            let uid = match new.uid {
                Some(uid) => {
                    check_id("uid", uid)?;
                    if let Some(u) = users.iter().find(|u| u.uid == uid) {
                        return Err(ServiceError::Exists(format!(
                            "uid {uid} belongs to user '{}'",
                            u.name
                        )));
                    }
                    uid
                }
                None => (FIRST_ID..=MAX_ID)
                    .find(|id| !users.iter().any(|u| u.uid == *id))
                    .ok_or_else(|| ServiceError::Invalid("no free uid".into()))?,
            };
            for g in &new.groups {
                if !groups.iter().any(|x| &x.name == g) {
                    return Err(ServiceError::NotFound(format!(
                        "no such group '{g}' (add it first: tank group add {g})"
                    )));
                }
            }
            let gid = match new.groups.first() {
                Some(g) => groups.iter().find(|x| &x.name == g).expect("checked").gid,
                None => USERS_GID,
            };
            let user = User {
                name: new.name.clone(),
                uid,
                gid,
                admin: new.admin,
                s3_bucket_create: false,
                password,
                nt_hash: new.password.as_deref().map(nt_hash),
                chap_secret: None,
                created: now_secs(),
            };
            let mut table = txn.open_table(USERS)?;
            table.insert(user.name.as_str(), to_json(&user).as_slice())?;
            drop(table);
            let mut gt = txn.open_table(GROUPS)?;
            for g in groups.iter_mut().filter(|g| new.groups.contains(&g.name)) {
                if !g.members.contains(&user.name) {
                    g.members.push(user.name.clone());
                    g.members.sort();
                }
                gt.insert(g.name.as_str(), to_json(g).as_slice())?;
            }
            user
        };
        self.committed(txn)?;
        Ok(user)
    }

    pub fn user(&self, name: &str) -> Res<User> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(USERS)?;
        let raw = table
            .get(name)?
            .ok_or_else(|| ServiceError::NotFound(format!("no such user '{name}'")))?;
        from_json("user", raw.value())
    }

    /// Every user, by name.
    pub fn users(&self) -> Res<Vec<User>> {
        let txn = self.db.begin_read()?;
        Ok(all_of!(txn, USERS, User, "user"))
    }

    pub fn user_by_uid(&self, uid: u32) -> Res<Option<User>> {
        Ok(self.users()?.into_iter().find(|u| u.uid == uid))
    }

    /// The groups `name` belongs to (its primary group first when it is a record).
    pub fn groups_of(&self, name: &str) -> Res<Vec<Group>> {
        let user = self.user(name)?;
        let mut out: Vec<Group> = self
            .groups()?
            .into_iter()
            .filter(|g| g.members.iter().any(|m| m == name) || g.gid == user.gid)
            .collect();
        out.sort_by_key(|g| g.gid != user.gid);
        Ok(out)
    }

    pub fn set_password(&self, name: &str, password: &str) -> Res<()> {
        let hash = hash_password(password)?;
        let nt = nt_hash(password);
        self.update_user(name, |u| {
            u.password = Some(hash);
            u.nt_hash = Some(nt);
            Ok(())
        })
        .map(drop)
    }

    /// `user set NAME KEY=VALUE`: `uid=N`, `admin=on|off`, `group=G` (the primary group),
    /// `s3_bucket_create=on|off`, `chap_secret=SECRET` (12 to 255 printable characters, as
    /// initiators accept; empty: none).
    pub fn set_user(&self, name: &str, key: &str, value: &str) -> Res<User> {
        let groups = self.groups()?;
        let users = self.users()?;
        self.update_user(name, |u| {
            match key {
                "uid" => {
                    let uid: u32 = value
                        .parse()
                        .map_err(|_| ServiceError::Invalid(format!("invalid uid '{value}'")))?;
                    check_id("uid", uid)?;
                    if let Some(o) = users.iter().find(|o| o.uid == uid && o.name != u.name) {
                        return Err(ServiceError::Exists(format!(
                            "uid {uid} belongs to user '{}'",
                            o.name
                        )));
                    }
                    u.uid = uid;
                }
                "admin" => {
                    u.admin = match value {
                        "on" | "yes" | "true" => true,
                        "off" | "no" | "false" => false,
                        _ => {
                            return Err(ServiceError::Invalid(format!(
                                "invalid value '{value}' for admin: on or off"
                            )))
                        }
                    }
                }
                "s3_bucket_create" => {
                    u.s3_bucket_create = match value {
                        "on" | "yes" | "true" => true,
                        "off" | "no" | "false" => false,
                        _ => {
                            return Err(ServiceError::Invalid(format!(
                                "invalid value '{value}' for s3_bucket_create: on or off"
                            )))
                        }
                    }
                }
                "chap_secret" => {
                    if value.is_empty() {
                        u.chap_secret = None;
                    } else if (12..=255).contains(&value.len())
                        && value.chars().all(|c| c.is_ascii_graphic())
                    {
                        u.chap_secret = Some(value.to_string());
                    } else {
                        return Err(ServiceError::Invalid(
                            "a CHAP secret has 12 to 255 printable characters without spaces (RFC 7143 asks for at least 96 bits)".into(),
                        ));
                    }
                }
                "group" => {
                    let g = groups.iter().find(|g| g.name == value).ok_or_else(|| {
                        ServiceError::NotFound(format!("no such group '{value}'"))
                    })?;
                    u.gid = g.gid;
                }
                _ => {
                    return Err(ServiceError::Invalid(format!(
                    "unknown user setting '{key}' (settings: uid, admin, group, s3_bucket_create, chap_secret)"
                )))
                }
            }
            Ok(())
        })
    }

    fn update_user(&self, name: &str, f: impl FnOnce(&mut User) -> Res<()>) -> Res<User> {
        let txn = self.db.begin_write()?;
        let user = {
            let mut table = txn.open_table(USERS)?;
            let mut user: User = {
                let raw = table
                    .get(name)?
                    .ok_or_else(|| ServiceError::NotFound(format!("no such user '{name}'")))?;
                from_json("user", raw.value())?
            };
            f(&mut user)?;
            table.insert(name, to_json(&user).as_slice())?;
            user
        };
        self.committed(txn)?;
        Ok(user)
    }

    /// Removes a user with its keys, tokens and group memberships.
    pub fn remove_user(&self, name: &str) -> Res<()> {
        let txn = self.db.begin_write()?;
        {
            let keys: Vec<AccessKey> = all_of!(txn, KEYS, AccessKey, "key");
            let tokens: Vec<Token> = all_of!(txn, TOKENS, Token, "token");
            let groups: Vec<Group> = all_of!(txn, GROUPS, Group, "group");
            let mut users = txn.open_table(USERS)?;
            if users.remove(name)?.is_none() {
                return Err(ServiceError::NotFound(format!("no such user '{name}'")));
            }
            let mut kt = txn.open_table(KEYS)?;
            for k in keys.iter().filter(|k| k.user == name) {
                kt.remove(k.access_key.as_str())?;
            }
            let mut tt = txn.open_table(TOKENS)?;
            for t in tokens.iter().filter(|t| t.user == name) {
                tt.remove(t.id.as_str())?;
            }
            let mut gt = txn.open_table(GROUPS)?;
            for mut g in groups
                .into_iter()
                .filter(|g| g.members.iter().any(|m| m == name))
            {
                g.members.retain(|m| m != name);
                gt.insert(g.name.as_str(), to_json(&g).as_slice())?;
            }
        }
        self.committed(txn)?;
        Ok(())
    }

    /// The user whose password this is; a wrong name or password is the same answer.
    pub fn check_password(&self, name: &str, password: &str) -> Res<User> {
        let denied = || ServiceError::Unauthenticated("wrong user name or password".into());
        let user = self.user(name).map_err(|_| denied())?;
        let Some(phc) = &user.password else {
            return Err(denied());
        };
        let parsed = PasswordHash::new(phc)
            .map_err(|e| ServiceError::Store(format!("damaged password hash of '{name}': {e}")))?;
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .map_err(|_| denied())?;
        Ok(user)
    }

    // ---- groups ----

    pub fn add_group(&self, name: &str, gid: Option<u32>) -> Res<Group> {
        validate_name("group", name)?;
        let txn = self.db.begin_write()?;
        let group = {
            let groups: Vec<Group> = all_of!(txn, GROUPS, Group, "group");
            if groups.iter().any(|g| g.name == name) {
                return Err(ServiceError::Exists(format!("group '{name}' exists")));
            }
            let gid = match gid {
                Some(gid) => {
                    check_id("gid", gid)?;
                    if let Some(g) = groups.iter().find(|g| g.gid == gid) {
                        return Err(ServiceError::Exists(format!(
                            "gid {gid} belongs to group '{}'",
                            g.name
                        )));
                    }
                    gid
                }
                None => (FIRST_ID..=MAX_ID)
                    .find(|id| !groups.iter().any(|g| g.gid == *id))
                    .ok_or_else(|| ServiceError::Invalid("no free gid".into()))?,
            };
            let group = Group {
                name: name.to_string(),
                gid,
                members: Vec::new(),
            };
            txn.open_table(GROUPS)?
                .insert(name, to_json(&group).as_slice())?;
            group
        };
        self.committed(txn)?;
        Ok(group)
    }

    pub fn groups(&self) -> Res<Vec<Group>> {
        let txn = self.db.begin_read()?;
        Ok(all_of!(txn, GROUPS, Group, "group"))
    }

    /// Removes a group; refused while it is a user's primary group.
    pub fn remove_group(&self, name: &str) -> Res<()> {
        let txn = self.db.begin_write()?;
        {
            let users: Vec<User> = all_of!(txn, USERS, User, "user");
            let mut gt = txn.open_table(GROUPS)?;
            let group: Group = {
                let raw = gt
                    .get(name)?
                    .ok_or_else(|| ServiceError::NotFound(format!("no such group '{name}'")))?;
                from_json("group", raw.value())?
            };
            if let Some(u) = users.iter().find(|u| u.gid == group.gid) {
                return Err(ServiceError::Invalid(format!(
                    "cannot remove group '{name}': it is the primary group of user '{}' (tank user set {} group=OTHER)",
                    u.name, u.name
                )));
            }
            gt.remove(name)?;
        }
        self.committed(txn)?;
        Ok(())
    }

    /// Adds (or with `add` false, removes) `user` to `group`.
    pub fn set_member(&self, group: &str, user: &str, add: bool) -> Res<Group> {
        self.user(user)?;
        let txn = self.db.begin_write()?;
        let g = {
            let mut gt = txn.open_table(GROUPS)?;
            let mut g: Group = {
                let raw = gt
                    .get(group)?
                    .ok_or_else(|| ServiceError::NotFound(format!("no such group '{group}'")))?;
                from_json("group", raw.value())?
            };
            let has = g.members.iter().any(|m| m == user);
            match (add, has) {
                (true, true) => {
                    return Err(ServiceError::Exists(format!(
                        "user '{user}' is a member of '{group}' already"
                    )))
                }
                (false, false) => {
                    return Err(ServiceError::NotFound(format!(
                        "user '{user}' is not a member of '{group}'"
                    )))
                }
                (true, false) => {
                    g.members.push(user.to_string());
                    g.members.sort();
                }
                (false, true) => g.members.retain(|m| m != user),
            }
            gt.insert(group, to_json(&g).as_slice())?;
            g
        };
        self.committed(txn)?;
        Ok(g)
    }

    // ---- settings (remotes, replication tasks) ----

    /// Writes the record `name` of a settings table (replacing it), committed before return.
    pub fn put_setting<T: Serialize>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        name: &str,
        value: &T,
    ) -> Res<()> {
        let txn = self.db.begin_write()?;
        txn.open_table(table)?
            .insert(name, to_json(value).as_slice())?;
        self.committed(txn)
    }

    /// The record `name` of a settings table, if there is one.
    pub fn setting<T: for<'a> Deserialize<'a>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
        name: &str,
    ) -> Res<Option<T>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(table)?;
        let got = t.get(name)?;
        got.map(|raw| from_json(redb::TableHandle::name(&table), raw.value()))
            .transpose()
    }

    /// Every record of a settings table, by name.
    pub fn settings<T: for<'a> Deserialize<'a>>(
        &self,
        table: TableDefinition<&str, &[u8]>,
    ) -> Res<Vec<T>> {
        let txn = self.db.begin_read()?;
        Ok(all_of!(txn, table, T, redb::TableHandle::name(&table)))
    }

    /// Removes the record `name`; whether there was one.
    pub fn remove_setting(&self, table: TableDefinition<&str, &[u8]>, name: &str) -> Res<bool> {
        let txn = self.db.begin_write()?;
        let had = txn.open_table(table)?.remove(name)?.is_some();
        self.committed(txn)?;
        Ok(had)
    }

    // ---- S3 access keys ----

    /// A new access key of `user` (its secret is shown once here, and kept for SigV4).
    pub fn add_key(&self, user: &str) -> Res<AccessKey> {
        self.user(user)?;
        let key = AccessKey {
            access_key: format!("TK{}", random_string(ACCESS_KEY_LEN - 2, UPPER_DIGITS)),
            secret_key: random_string(SECRET_KEY_LEN, SECRET_ALPHABET),
            user: user.to_string(),
            created: now_secs(),
        };
        let txn = self.db.begin_write()?;
        txn.open_table(KEYS)?
            .insert(key.access_key.as_str(), to_json(&key).as_slice())?;
        self.committed(txn)?;
        Ok(key)
    }

    /// The keys of `user`, or of everyone.
    pub fn keys(&self, user: Option<&str>) -> Res<Vec<AccessKey>> {
        let txn = self.db.begin_read()?;
        let all: Vec<AccessKey> = all_of!(txn, KEYS, AccessKey, "key");
        Ok(all
            .into_iter()
            .filter(|k| user.is_none_or(|u| k.user == u))
            .collect())
    }

    /// The key with this id, if it exists (not revoked).
    pub fn key(&self, access_key: &str) -> Res<Option<AccessKey>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(KEYS)?;
        let got = table.get(access_key)?;
        got.map(|raw| from_json("key", raw.value())).transpose()
    }

    /// Revokes a key: it stops working at once.
    pub fn remove_key(&self, access_key: &str) -> Res<AccessKey> {
        let txn = self.db.begin_write()?;
        let key = {
            let mut table = txn.open_table(KEYS)?;
            let raw = table.remove(access_key)?.ok_or_else(|| {
                ServiceError::NotFound(format!("no such access key '{access_key}'"))
            })?;
            from_json("key", raw.value())?
        };
        self.committed(txn)?;
        Ok(key)
    }

    // ---- API tokens ----

    /// A new token of `user`: the record and the token itself, which is not kept.
    pub fn add_token(&self, user: &str) -> Res<(Token, String)> {
        self.user(user)?;
        let id = random_string(12, TOKEN_ALPHABET);
        let secret = random_string(50, TOKEN_ALPHABET);
        let token = Token {
            id: id.clone(),
            hash: sha256_hex(&secret),
            user: user.to_string(),
            created: now_secs(),
        };
        let txn = self.db.begin_write()?;
        txn.open_table(TOKENS)?
            .insert(id.as_str(), to_json(&token).as_slice())?;
        self.committed(txn)?;
        Ok((token, format!("tank_{id}_{secret}")))
    }

    pub fn tokens(&self, user: Option<&str>) -> Res<Vec<Token>> {
        let txn = self.db.begin_read()?;
        let all: Vec<Token> = all_of!(txn, TOKENS, Token, "token");
        Ok(all
            .into_iter()
            .filter(|t| user.is_none_or(|u| t.user == u))
            .collect())
    }

    /// The token record with this id, if it exists.
    pub fn token(&self, id: &str) -> Res<Option<Token>> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TOKENS)?;
        let got = table.get(id)?;
        got.map(|raw| from_json("token", raw.value())).transpose()
    }

    /// Revokes a token: it stops working at once.
    pub fn remove_token(&self, id: &str) -> Res<Token> {
        let txn = self.db.begin_write()?;
        let token = {
            let mut table = txn.open_table(TOKENS)?;
            let raw = table
                .remove(id)?
                .ok_or_else(|| ServiceError::NotFound(format!("no such token '{id}'")))?;
            from_json("token", raw.value())?
        };
        self.committed(txn)?;
        Ok(token)
    }

    /// The user a token (`tank_<id>_<secret>`) belongs to.
    pub fn check_token(&self, token: &str) -> Res<User> {
        let denied = || ServiceError::Unauthenticated("unknown or revoked token".into());
        let mut parts = token.splitn(3, '_');
        let (Some("tank"), Some(id), Some(secret)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(denied());
        };
        let record = self.token(id)?.ok_or_else(denied)?;
        // Both are hex digests of equal length: compare without an early exit.
        let given = sha256_hex(secret);
        let differ = given
            .bytes()
            .zip(record.hash.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differ != 0 || given.len() != record.hash.len() {
            return Err(denied());
        }
        self.user(&record.user).map_err(|_| denied())
    }

    // ---- backup ----

    pub fn export(&self) -> Res<Export> {
        let txn = self.db.begin_read()?;
        Ok(Export {
            version: EXPORT_VERSION,
            users: all_of!(txn, USERS, User, "user"),
            groups: all_of!(txn, GROUPS, Group, "group"),
            keys: all_of!(txn, KEYS, AccessKey, "key"),
            tokens: all_of!(txn, TOKENS, Token, "token"),
        })
    }

    /// Replaces every account with those of `data`, in one transaction, after checking it
    /// (names, unique ids, members and owners that exist, password hashes that parse).
    pub fn import(&self, data: &Export) -> Res<()> {
        if data.version != EXPORT_VERSION {
            return Err(ServiceError::Invalid(format!(
                "account export version {} is not supported (this build reads {EXPORT_VERSION})",
                data.version
            )));
        }
        let dup = |what: &str, v: &mut Vec<String>| -> Res<()> {
            v.sort();
            match v.windows(2).find(|w| w[0] == w[1]) {
                Some(w) => Err(ServiceError::Invalid(format!(
                    "{what} '{}' appears twice",
                    w[0]
                ))),
                None => Ok(()),
            }
        };
        for u in &data.users {
            validate_name("user", &u.name)?;
            check_id("uid", u.uid)?;
            if let Some(p) = &u.password {
                PasswordHash::new(p).map_err(|e| {
                    ServiceError::Invalid(format!("password hash of '{}': {e}", u.name))
                })?;
            }
        }
        for g in &data.groups {
            validate_name("group", &g.name)?;
            check_id("gid", g.gid)?;
            if let Some(m) = g
                .members
                .iter()
                .find(|m| !data.users.iter().any(|u| &u.name == *m))
            {
                return Err(ServiceError::Invalid(format!(
                    "group '{}' lists '{m}', who is not a user",
                    g.name
                )));
            }
        }
        for (user, what) in data
            .keys
            .iter()
            .map(|k| (&k.user, "access key"))
            .chain(data.tokens.iter().map(|t| (&t.user, "token")))
        {
            if !data.users.iter().any(|u| &u.name == user) {
                return Err(ServiceError::Invalid(format!(
                    "an {what} belongs to '{user}', who is not a user"
                )));
            }
        }
        dup(
            "user",
            &mut data.users.iter().map(|u| u.name.clone()).collect(),
        )?;
        dup(
            "uid",
            &mut data.users.iter().map(|u| u.uid.to_string()).collect(),
        )?;
        dup(
            "group",
            &mut data.groups.iter().map(|g| g.name.clone()).collect(),
        )?;
        dup(
            "gid",
            &mut data.groups.iter().map(|g| g.gid.to_string()).collect(),
        )?;
        dup(
            "access key",
            &mut data.keys.iter().map(|k| k.access_key.clone()).collect(),
        )?;
        dup(
            "token",
            &mut data.tokens.iter().map(|t| t.id.clone()).collect(),
        )?;
        let txn = self.db.begin_write()?;
        // The accounts only: the settings (remotes, tasks, uploads) stay as they are.
        for t in [USERS, GROUPS, KEYS, TOKENS] {
            txn.delete_table(t)?;
            txn.open_table(t)?;
        }
        {
            let mut t = txn.open_table(USERS)?;
            for u in &data.users {
                t.insert(u.name.as_str(), to_json(u).as_slice())?;
            }
            let mut t = txn.open_table(GROUPS)?;
            for g in &data.groups {
                t.insert(g.name.as_str(), to_json(g).as_slice())?;
            }
            let mut t = txn.open_table(KEYS)?;
            for k in &data.keys {
                t.insert(k.access_key.as_str(), to_json(k).as_slice())?;
            }
            let mut t = txn.open_table(TOKENS)?;
            for k in &data.tokens {
                t.insert(k.id.as_str(), to_json(k).as_slice())?;
            }
        }
        self.committed(txn)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Accounts) {
        let dir = tempfile::tempdir().unwrap();
        let a = Accounts::open(&dir.path().join("accounts.redb")).unwrap();
        (dir, a)
    }

    fn user(name: &str) -> NewUser {
        NewUser {
            name: name.into(),
            password: Some("correct horse".into()),
            ..NewUser::default()
        }
    }

    #[test]
    fn nt_hashes_are_samba_s() {
        // MD4 of the UTF-16LE password, as Samba's smbpasswd keeps it.
        assert_eq!(nt_hash("password"), "8846F7EAEE8FB117AD06BDD830B7586C");
        assert_eq!(nt_hash(""), "31D6CFE0D16AE931B73C59D7E0C089C0");
    }

    #[test]
    fn users_get_free_ids_and_argon2id_hashes() {
        let (_d, a) = store();
        let alice = a.add_user(user("alice")).unwrap();
        assert_eq!((alice.uid, alice.gid), (FIRST_ID, USERS_GID));
        let hash = alice.password.clone().unwrap();
        assert!(hash.starts_with("$argon2id$"), "{hash}");
        assert!(!hash.contains("correct horse"));
        let bob = a
            .add_user(NewUser {
                uid: Some(2000),
                ..user("bob")
            })
            .unwrap();
        assert_eq!(bob.uid, 2000);
        assert_eq!(a.add_user(user("carol")).unwrap().uid, FIRST_ID + 1);
        assert!(matches!(
            a.add_user(user("alice")),
            Err(ServiceError::Exists(_))
        ));
        let dup_uid = NewUser {
            uid: Some(2000),
            ..user("dave")
        };
        assert!(matches!(a.add_user(dup_uid), Err(ServiceError::Exists(_))));
        for bad in ["", "Alice", "1x", "a b", "a/b", &"x".repeat(33)] {
            assert!(
                matches!(a.add_user(user(bad)), Err(ServiceError::Invalid(_))),
                "{bad:?}"
            );
        }
        let weak = NewUser {
            password: Some("short".into()),
            ..user("erin")
        };
        assert!(matches!(a.add_user(weak), Err(ServiceError::Invalid(_))));
        // Nothing of the refused adds was kept.
        let names: Vec<String> = a.users().unwrap().into_iter().map(|u| u.name).collect();
        assert_eq!(names, ["alice", "bob", "carol"]);
    }

    #[test]
    fn passwords_check_and_change() {
        let (_d, a) = store();
        a.add_user(user("alice")).unwrap();
        a.check_password("alice", "correct horse").unwrap();
        for (name, pw) in [("alice", "wrong horse"), ("nobody", "correct horse")] {
            let e = a.check_password(name, pw).unwrap_err();
            assert!(matches!(e, ServiceError::Unauthenticated(_)));
            assert_eq!(
                e.to_string(),
                "not authenticated: wrong user name or password"
            );
        }
        a.set_password("alice", "battery staple").unwrap();
        assert!(a.check_password("alice", "correct horse").is_err());
        a.check_password("alice", "battery staple").unwrap();
    }

    #[test]
    fn groups_membership_and_primary_group() {
        let (_d, a) = store();
        let staff = a.add_group("staff", Some(3000)).unwrap();
        assert_eq!(staff.gid, 3000);
        assert_eq!(a.add_group("media", None).unwrap().gid, FIRST_ID);
        let alice = a
            .add_user(NewUser {
                groups: vec!["staff".into(), "media".into()],
                ..user("alice")
            })
            .unwrap();
        assert_eq!(alice.gid, 3000);
        let names: Vec<String> = a
            .groups_of("alice")
            .unwrap()
            .into_iter()
            .map(|g| g.name)
            .collect();
        assert_eq!(names, ["staff", "media"]);
        let missing = NewUser {
            groups: vec!["nosuch".into()],
            ..user("bob")
        };
        assert!(matches!(
            a.add_user(missing),
            Err(ServiceError::NotFound(_))
        ));
        a.add_user(user("bob")).unwrap();
        a.set_member("media", "bob", true).unwrap();
        assert!(matches!(
            a.set_member("media", "bob", true),
            Err(ServiceError::Exists(_))
        ));
        let e = a.remove_group("staff").unwrap_err().to_string();
        assert!(e.contains("primary group of user 'alice'"), "{e}");
        a.set_user("alice", "group", "media").unwrap();
        a.remove_group("staff").unwrap();
        a.remove_user("bob").unwrap();
        let media = a
            .groups()
            .unwrap()
            .into_iter()
            .find(|g| g.name == "media")
            .unwrap();
        assert_eq!(media.members, ["alice"]);
    }

    #[test]
    fn keys_and_tokens_work_until_revoked() {
        let (_d, a) = store();
        a.add_user(user("alice")).unwrap();
        let k1 = a.add_key("alice").unwrap();
        let k2 = a.add_key("alice").unwrap();
        assert_ne!(k1.access_key, k2.access_key);
        assert_eq!(k1.access_key.len(), 20);
        assert_eq!(k1.secret_key.len(), 40);
        assert_eq!(a.keys(Some("alice")).unwrap().len(), 2);
        assert_eq!(
            a.key(&k1.access_key).unwrap().unwrap().secret_key,
            k1.secret_key
        );
        a.remove_key(&k1.access_key).unwrap();
        assert!(a.key(&k1.access_key).unwrap().is_none());
        assert!(matches!(
            a.remove_key(&k1.access_key),
            Err(ServiceError::NotFound(_))
        ));

        let (rec, token) = a.add_token("alice").unwrap();
        assert!(!rec.hash.contains(&token[5..]));
        assert_eq!(a.check_token(&token).unwrap().name, "alice");
        let mut forged = token.clone();
        forged.pop();
        forged.push('!');
        for bad in [
            forged.as_str(),
            "tank_x_y",
            "",
            "Bearer x",
            &token[..token.len() - 1],
        ] {
            assert!(
                matches!(a.check_token(bad), Err(ServiceError::Unauthenticated(_))),
                "{bad}"
            );
        }
        a.remove_token(&rec.id).unwrap();
        assert!(a.check_token(&token).is_err());
        // Removing a user revokes what it had.
        a.add_key("alice").unwrap();
        let (_, t2) = a.add_token("alice").unwrap();
        a.remove_user("alice").unwrap();
        assert!(a.keys(None).unwrap().is_empty());
        assert!(a.check_token(&t2).is_err());
        assert!(matches!(a.add_key("alice"), Err(ServiceError::NotFound(_))));
    }

    #[test]
    fn survives_reopening_and_round_trips_through_export() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("accounts.redb");
        let export = {
            let a = Accounts::open(&path).unwrap();
            a.add_group("staff", None).unwrap();
            a.add_user(NewUser {
                groups: vec!["staff".into()],
                admin: true,
                ..user("alice")
            })
            .unwrap();
            a.add_key("alice").unwrap();
            a.add_token("alice").unwrap();
            a.export().unwrap()
        };
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let a = Accounts::open(&path).unwrap();
        assert_eq!(a.export().unwrap(), export);
        a.check_password("alice", "correct horse").unwrap();

        let other = tempfile::tempdir().unwrap();
        let b = Accounts::open(&other.path().join("accounts.redb")).unwrap();
        b.add_user(user("zed")).unwrap();
        b.import(&export).unwrap();
        assert_eq!(b.export().unwrap(), export);
        b.check_password("alice", "correct horse").unwrap();

        // A bad export is refused whole and changes nothing.
        let mut bad = export.clone();
        bad.groups[0].members.push("ghost".into());
        assert!(matches!(b.import(&bad), Err(ServiceError::Invalid(_))));
        let mut bad = export.clone();
        bad.users.push(bad.users[0].clone());
        assert!(matches!(b.import(&bad), Err(ServiceError::Invalid(_))));
        let mut bad = export.clone();
        bad.version = 9;
        assert!(matches!(b.import(&bad), Err(ServiceError::Invalid(_))));
        assert_eq!(b.export().unwrap(), export);
    }
}
