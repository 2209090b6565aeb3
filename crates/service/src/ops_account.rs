//! Account and share requests: users, groups, S3 keys, API tokens, and the shares of the
//! imported pools.
//!
//! # Theory of operation
//! Accounts live in the service's store (`accounts.rs`); a request here is one store
//! transaction, authorized before it runs (`Service::access`: a user's own password, keys
//! and tokens are its own; the rest is the administrators'). Listings leave out secrets:
//! a key's secret and a token are shown once, in the response that makes them. Shares are
//! kept with their datasets; the service's one registry checks each protocol's options and
//! tells the watching protocol servers what changed.

use std::sync::Arc;

use crate::accounts::NewUser;
use crate::api::{KeyEntry, NewKey, NewToken, Request, Response, TokenEntry, UserEntry};
use crate::error::ServiceError;
use crate::service::{Ctx, Res, Service};

impl Service {
    pub(crate) fn account_request(&self, _ctx: &mut Ctx, req: Request) -> Res<Response> {
        use Request as R;
        let a = self.accounts()?;
        match req {
            R::UserAdd {
                name,
                uid,
                groups,
                admin,
                password,
            } => {
                if password.as_deref().is_some_and(str::is_empty) {
                    return Err(ServiceError::Invalid("the password is empty".into()));
                }
                Ok(Response::User(
                    a.add_user(NewUser {
                        name,
                        uid,
                        groups,
                        admin,
                        password,
                    })?
                    .public(),
                ))
            }
            R::UserPasswd { name, password } => {
                if password.is_empty() {
                    return Err(ServiceError::Invalid("the password is empty".into()));
                }
                a.set_password(&name, &password)?;
                Ok(Response::Done {
                    message: format!("password of '{name}' changed"),
                })
            }
            R::UserSet { name, settings } => {
                for (k, v) in &settings {
                    a.set_user(&name, k, v)?;
                }
                Ok(Response::User(a.user(&name)?.public()))
            }
            R::UserList => {
                let groups = a.groups()?;
                Ok(Response::Users(
                    a.users()?
                        .into_iter()
                        .map(|u| UserEntry {
                            groups: groups
                                .iter()
                                .filter(|g| g.members.contains(&u.name))
                                .map(|g| g.name.clone())
                                .collect(),
                            password: u.has_password(),
                            name: u.name,
                            uid: u.uid,
                            gid: u.gid,
                            admin: u.admin,
                            created: u.created,
                        })
                        .collect(),
                ))
            }
            R::UserRemove { name } => {
                a.remove_user(&name)?;
                Ok(Response::Done {
                    message: format!("removed user '{name}' (its keys and tokens are revoked)"),
                })
            }
            R::AccountsExport => Ok(Response::Accounts {
                accounts: Box::new(a.export()?),
            }),
            R::AccountsImport { data } => {
                a.import(&data)?;
                Ok(Response::Done {
                    message: format!(
                        "{} users, {} groups, {} keys, {} tokens",
                        data.users.len(),
                        data.groups.len(),
                        data.keys.len(),
                        data.tokens.len()
                    ),
                })
            }
            R::GroupAdd { name, gid } => {
                let g = a.add_group(&name, gid)?;
                Ok(Response::Groups(vec![g]))
            }
            R::GroupList => Ok(Response::Groups(a.groups()?)),
            R::GroupRemove { name } => {
                a.remove_group(&name)?;
                Ok(Response::Done {
                    message: format!("removed group '{name}'"),
                })
            }
            R::GroupMember { group, user, add } => {
                a.set_member(&group, &user, add)?;
                Ok(Response::Done {
                    message: if add {
                        format!("'{user}' is a member of '{group}'")
                    } else {
                        format!("'{user}' is no longer a member of '{group}'")
                    },
                })
            }
            R::KeyAdd { user } => {
                let k = a.add_key(&user)?;
                Ok(Response::Key(NewKey {
                    user: k.user,
                    access_key: k.access_key,
                    secret_key: k.secret_key,
                }))
            }
            R::KeyList { user } => Ok(Response::Keys(
                a.keys(user.as_deref())?
                    .into_iter()
                    .map(|k| KeyEntry {
                        access_key: k.access_key,
                        user: k.user,
                        created: k.created,
                    })
                    .collect(),
            )),
            R::KeyRemove { access_key } => {
                let k = a.remove_key(&access_key)?;
                Ok(Response::Done {
                    message: format!("access key {} of '{}' revoked", k.access_key, k.user),
                })
            }
            R::TokenAdd { user } => {
                let (t, token) = a.add_token(&user)?;
                Ok(Response::Token(NewToken {
                    user: t.user,
                    id: t.id,
                    token,
                }))
            }
            R::TokenList { user } => Ok(Response::Tokens(
                a.tokens(user.as_deref())?
                    .into_iter()
                    .map(|t| TokenEntry {
                        id: t.id,
                        user: t.user,
                        created: t.created,
                    })
                    .collect(),
            )),
            R::TokenRemove { id } => {
                let t = a.remove_token(&id)?;
                Ok(Response::Done {
                    message: format!("token {} of '{}' revoked", t.id, t.user),
                })
            }
            _ => unreachable!("not an account request"),
        }
    }

    pub(crate) fn share_request(&self, ctx: &mut Ctx, req: Request) -> Res<Response> {
        use Request as R;
        let opened = self.open_all(ctx)?;
        let pools: Vec<Arc<tank_dataset::Dsl>> = opened.iter().map(|o| o.dsl.clone()).collect();
        let accounts = self.accounts().ok();
        match req {
            R::ShareAdd {
                protocol,
                name,
                dataset,
                options,
            } => Ok(Response::Share(
                self.shares
                    .add(&pools, &protocol, &name, &dataset, &options, accounts)?,
            )),
            R::ShareList => {
                let mut all = self.shares.list(&pools);
                // A user sees the shares it may use; an administrator every one.
                if let crate::caller::Caller::User { name, .. } = ctx.caller {
                    let groups: Vec<String> = match &accounts {
                        Some(a) => a.groups_of(name)?.into_iter().map(|g| g.name).collect(),
                        None => Vec::new(),
                    };
                    all.retain(|s| s.usable_by(name, &groups));
                }
                Ok(Response::Shares(all))
            }
            R::ShareSet { name, settings } => Ok(Response::Share(
                self.shares.set(&pools, &name, &settings, accounts)?,
            )),
            R::ShareRemove { name } => Ok(Response::Share(self.shares.remove(&pools, &name)?)),
            _ => unreachable!("not a share request"),
        }
    }
}
