//! Who is asking, and what the two roles may do.
//!
//! # Theory of operation
//! Every request carries a [`Caller`], found by the front end that took it: on the local
//! socket from the peer's uid (SO_PEERCRED): root is an administrator, another uid is the
//! account with that uid or is refused; over the network from a session, a token or a key
//! (later front ends). [`authorize`] then checks the [`Access`] the request needs:
//! - an administrator may do everything;
//! - a user may read the state of the pools and datasets, and manage its own account (its
//!   password, keys and tokens), nothing else;
//! - an anonymous caller may do nothing that [`authorize`] is asked about (what is open to
//!   anyone, such as an anonymous metrics scrape, is the front end's setting, not a role).

use crate::accounts::Accounts;
use crate::error::ServiceError;

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An administrator: root on the local socket, or an account marked admin.
    Admin { name: String },
    /// A user: its own account, and reading what is shared with it.
    User { name: String, uid: u32 },
    /// Nobody known.
    Anonymous,
}

impl Caller {
    /// The caller on the local socket whose peer has `uid`.
    pub fn local(accounts: &Accounts, uid: u32) -> Result<Caller, ServiceError> {
        if uid == 0 {
            return Ok(Caller::Admin {
                name: "root".into(),
            });
        }
        match accounts.user_by_uid(uid)? {
            Some(u) if u.admin => Ok(Caller::Admin { name: u.name }),
            Some(u) => Ok(Caller::User {
                name: u.name,
                uid: u.uid,
            }),
            None => Err(ServiceError::Unauthenticated(format!(
                "uid {uid} has no tank account (an administrator adds one: tank user add NAME --uid {uid})"
            ))),
        }
    }

    /// The account name, if the caller has one.
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Admin { name } | Caller::User { name, .. } => Some(name),
            Caller::Anonymous => None,
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin { .. })
    }
}

/// What a request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Changes to pools, datasets, shares, other accounts, tunables: administrators.
    Admin,
    /// Reading the state of pools and datasets: any known caller.
    Read,
    /// The account named: its owner, or an administrator.
    Account(String),
}

/// Whether `caller` may do what needs `access`; the refusal says why.
pub fn authorize(caller: &Caller, access: &Access) -> Result<(), ServiceError> {
    match (caller, access) {
        (Caller::Admin { .. }, _) => Ok(()),
        (Caller::Anonymous, _) => Err(ServiceError::Unauthenticated(
            "log in, or give a token or key".into(),
        )),
        (Caller::User { .. }, Access::Read) => Ok(()),
        (Caller::User { name, .. }, Access::Account(owner)) if name == owner => Ok(()),
        (Caller::User { name, .. }, Access::Account(owner)) => Err(ServiceError::Denied(format!(
            "'{name}' may manage only its own account, not '{owner}'"
        ))),
        (Caller::User { name, .. }, Access::Admin) => Err(ServiceError::Denied(format!(
            "'{name}' is not an administrator"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::NewUser;

    #[test]
    fn roles_matrix() {
        let dir = tempfile::tempdir().unwrap();
        let a = Accounts::open(&dir.path().join("a.redb")).unwrap();
        a.add_user(NewUser {
            name: "alice".into(),
            uid: Some(1500),
            admin: true,
            ..NewUser::default()
        })
        .unwrap();
        a.add_user(NewUser {
            name: "bob".into(),
            uid: Some(1501),
            ..NewUser::default()
        })
        .unwrap();
        let root = Caller::local(&a, 0).unwrap();
        let alice = Caller::local(&a, 1500).unwrap();
        let bob = Caller::local(&a, 1501).unwrap();
        assert!(root.is_admin() && alice.is_admin() && !bob.is_admin());
        let e = Caller::local(&a, 4242).unwrap_err();
        assert!(matches!(e, ServiceError::Unauthenticated(_)));
        assert!(
            e.to_string().contains("tank user add NAME --uid 4242"),
            "{e}"
        );

        let own = Access::Account("bob".into());
        let other = Access::Account("alice".into());
        let cases = [
            (&root, Access::Admin, true),
            (&alice, Access::Admin, true),
            (&alice, own.clone(), true),
            (&bob, Access::Read, true),
            (&bob, own.clone(), true),
            (&bob, other.clone(), false),
            (&bob, Access::Admin, false),
            (&Caller::Anonymous, Access::Read, false),
            (&Caller::Anonymous, own, false),
            (&Caller::Anonymous, Access::Admin, false),
        ];
        for (caller, access, ok) in cases {
            let r = authorize(caller, &access);
            assert_eq!(r.is_ok(), ok, "{caller:?} {access:?}: {r:?}");
            if let Err(e) = r {
                let status = e.http_status();
                assert!(status == 401 || status == 403, "{e}");
            }
        }
    }
}
