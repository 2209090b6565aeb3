//! The S3 operations of versioning and Object Lock: bucket versioning, ListObjectVersions,
//! the bucket's lock configuration, and each version's retention and legal hold.
//!
//! # Theory of operation
//! A bucket's versioning state and whether it has Object Lock are options of its share
//! (`versioning`, `object_lock`), changed through the service as an administrator would
//! (so they move with the dataset, and `tank share list` shows them); the default
//! retention is a bucket setting kept with the dataset (`store::bucket_conf`). The versions
//! themselves are `versions.rs`'. Who may change a bucket's settings: its users (who may
//! write it) and administrators. Retention is shortened or a GOVERNANCE one removed only
//! with `x-amz-bypass-governance-retention`, which only an administrator's request
//! carries with effect; a COMPLIANCE retention binds everyone.

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};
use tank_service::api::Request;

use crate::buckets::Versioning;
use crate::ops::{ms_of, s3_errno, ts, ts_ms, url_encode, TankS3};
use crate::store::{self, blocking, Retention};
use crate::versions::{self, DefaultLock};

impl TankS3 {
    /// Changes options of the bucket's share, as the S3 front end.
    pub(crate) async fn set_share(&self, bucket: &str, settings: &[(&str, &str)]) -> S3Result<()> {
        let req = Request::ShareSet {
            name: bucket.to_string(),
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        // A committed change of the dataset's record: off the runtime's workers.
        let (svc, buckets) = (self.svc.clone(), self.buckets.clone());
        tokio::task::spawn_blocking(move || {
            let admin = tank_service::Caller::Admin { name: "s3".into() };
            let r = svc.handle(&admin, req, None).0;
            buckets.refresh();
            r
        })
        .await
        .map_err(|e| s3_error!(InternalError, "{e}"))?
        .map_err(|e| s3_error!(InvalidBucketState, "{e}"))?;
        Ok(())
    }
}

pub async fn put_bucket_versioning(
    s: &TankS3,
    req: S3Request<PutBucketVersioningInput>,
) -> S3Result<S3Response<PutBucketVersioningOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, _fs) = s.bucket(&req.input.bucket, &p, true)?;
    let cfg = req.input.versioning_configuration;
    if cfg
        .mfa_delete
        .as_ref()
        .is_some_and(|m| m.as_str() == MFADelete::ENABLED)
    {
        return Err(s3_error!(
            NotImplemented,
            "MFA Delete is not served (no MFA devices)"
        ));
    }
    let next = match cfg.status.as_ref().map(|x| x.as_str()) {
        Some(BucketVersioningStatus::ENABLED) => "enabled",
        Some(BucketVersioningStatus::SUSPENDED) => "suspended",
        _ => {
            return Err(s3_error!(
                MalformedXML,
                "the versioning status is Enabled or Suspended"
            ))
        }
    };
    if next == "suspended" && b.object_lock {
        return Err(s3_error!(
            InvalidBucketState,
            "An Object Lock configuration is present on this bucket, so the versioning state cannot be changed."
        ));
    }
    let current = match b.versioning {
        Versioning::Off => "off",
        Versioning::Enabled => "enabled",
        Versioning::Suspended => "suspended",
    };
    if current != next {
        let name = b.name.clone();
        drop(b);
        s.set_share(&name, &[("versioning", next)]).await?;
    }
    Ok(S3Response::new(PutBucketVersioningOutput::default()))
}

pub async fn list_object_versions(
    s: &TankS3,
    req: S3Request<ListObjectVersionsInput>,
) -> S3Result<S3Response<ListObjectVersionsOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let (_b, fs) = s.bucket_to_list(&i.bucket, &p)?;
    let max = i.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
    let prefix = i.prefix.clone().unwrap_or_default();
    let key_marker = i.key_marker.clone().unwrap_or_default();
    let version_marker = i.version_id_marker.clone().filter(|v| !v.is_empty());
    if version_marker.is_some() && key_marker.is_empty() {
        return Err(s3_error!(
            InvalidArgument,
            "A version-id marker cannot be specified without a key marker."
        ));
    }
    let (pf, dl, km, vm) = (
        prefix.clone(),
        i.delimiter.clone(),
        key_marker.clone(),
        version_marker.clone(),
    );
    let l = blocking(fs, move |f| {
        versions::list_versions(f, &pf, dl.as_deref(), &km, vm.as_deref(), max)
    })
    .await
    .map_err(s3_errno)?;
    let url = i
        .encoding_type
        .as_ref()
        .is_some_and(|e| e.as_str() == "url");
    let enc = |s: &str| if url { url_encode(s) } else { s.to_string() };
    let mut objects = Vec::new();
    let mut markers = Vec::new();
    for (key, o, latest) in &l.versions {
        if o.marker {
            markers.push(DeleteMarkerEntry {
                is_latest: Some(*latest),
                key: Some(enc(key)),
                last_modified: Some(ts(o.mtime)),
                version_id: Some(o.version_id()),
                owner: None,
            });
        } else {
            objects.push(ObjectVersion {
                e_tag: Some(ETag::Strong(o.etag.clone())),
                is_latest: Some(*latest),
                key: Some(enc(key)),
                last_modified: Some(ts(o.mtime)),
                size: Some(o.size as i64),
                storage_class: Some(ObjectVersionStorageClass::from_static(
                    ObjectVersionStorageClass::STANDARD,
                )),
                version_id: Some(o.version_id()),
                ..ObjectVersion::default()
            });
        }
    }
    Ok(S3Response::new(ListObjectVersionsOutput {
        name: Some(i.bucket),
        prefix: Some(enc(&prefix)),
        delimiter: i.delimiter.as_deref().map(enc),
        key_marker: Some(enc(&key_marker)),
        version_id_marker: Some(version_marker.unwrap_or_default()),
        max_keys: Some(max as i32),
        is_truncated: Some(l.truncated),
        next_key_marker: l.next_key.as_deref().filter(|_| l.truncated).map(enc),
        next_version_id_marker: l.next_version.filter(|_| l.truncated),
        encoding_type: i.encoding_type,
        common_prefixes: Some(
            l.prefixes
                .iter()
                .map(|p| CommonPrefix {
                    prefix: Some(enc(p)),
                })
                .collect(),
        ),
        versions: Some(objects),
        delete_markers: Some(markers),
        ..ListObjectVersionsOutput::default()
    }))
}

pub async fn put_object_lock_configuration(
    s: &TankS3,
    req: S3Request<PutObjectLockConfigurationInput>,
) -> S3Result<S3Response<PutObjectLockConfigurationOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, fs) = s.bucket(&req.input.bucket, &p, true)?;
    let cfg = req
        .input
        .object_lock_configuration
        .ok_or_else(|| s3_error!(MalformedXML, "no ObjectLockConfiguration"))?;
    if cfg.object_lock_enabled.as_ref().map(|e| e.as_str()) != Some(ObjectLockEnabled::ENABLED) {
        return Err(s3_error!(MalformedXML, "ObjectLockEnabled must be Enabled"));
    }
    if !b.object_lock && b.versioning != Versioning::Enabled {
        return Err(s3_error!(
            InvalidBucketState,
            "Versioning must be 'Enabled' on the bucket to apply a Object Lock configuration"
        ));
    }
    let rule = match cfg.rule.and_then(|r| r.default_retention) {
        None => None,
        Some(d) => {
            let mode = d
                .mode
                .map(|m| m.as_str().to_string())
                .filter(|m| m == "GOVERNANCE" || m == "COMPLIANCE")
                .ok_or_else(|| {
                    s3_error!(
                        MalformedXML,
                        "a default retention needs a Mode: GOVERNANCE or COMPLIANCE"
                    )
                })?;
            match (d.days, d.years) {
                (Some(n), None) | (None, Some(n)) if n > 0 => {}
                (Some(_), Some(_)) => {
                    return Err(s3_error!(
                        MalformedXML,
                        "a default retention has Days or Years, not both"
                    ))
                }
                _ => {
                    return Err(s3_error!(
                        InvalidArgument,
                        "Default retention period must be a positive integer value."
                    ))
                }
            }
            Some(DefaultLock {
                mode,
                days: d.days,
                years: d.years,
            })
        }
    };
    let v = rule
        .as_ref()
        .map(|r| serde_json::to_vec(r).expect("a default lock serializes"));
    blocking(fs, move |f| store::set_bucket_conf(f, "lock", v.as_deref()))
        .await
        .map_err(s3_errno)?;
    if !b.object_lock {
        let name = b.name.clone();
        drop(b);
        s.set_share(&name, &[("object_lock", "on")]).await?;
    }
    Ok(S3Response::new(PutObjectLockConfigurationOutput::default()))
}

pub async fn get_object_lock_configuration(
    s: &TankS3,
    req: S3Request<GetObjectLockConfigurationInput>,
) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, fs) = s.bucket(&req.input.bucket, &p, false)?;
    if !b.object_lock {
        return Err(s3_error!(
            ObjectLockConfigurationNotFoundError,
            "Object Lock configuration does not exist for this bucket"
        ));
    }
    let rule = blocking(fs, versions::default_lock)
        .await
        .map_err(s3_errno)?;
    Ok(S3Response::new(GetObjectLockConfigurationOutput {
        object_lock_configuration: Some(ObjectLockConfiguration {
            object_lock_enabled: Some(ObjectLockEnabled::from_static(ObjectLockEnabled::ENABLED)),
            rule: rule.map(|r| ObjectLockRule {
                default_retention: Some(DefaultRetention {
                    mode: Some(ObjectLockRetentionMode::from(r.mode)),
                    days: r.days,
                    years: r.years,
                }),
            }),
        }),
    }))
}

/// Sets the retention and legal hold of a version, from what `change` makes of the
/// current ones (or refuses).
async fn change_lock(
    s: &TankS3,
    p: &crate::buckets::Principal,
    bucket: &str,
    key: &str,
    version: Option<&str>,
    change: impl FnOnce(&store::Obj) -> S3Result<(Option<Retention>, bool)> + Send + 'static,
) -> S3Result<()> {
    crate::ops::check_key(key)?;
    let (b, fs) = s.bucket(bucket, p, true)?;
    if !b.object_lock {
        return Err(no_lock());
    }
    s.find_version(&fs, key, version).await?;
    let (k, v) = (key.to_string(), version.map(str::to_string));
    let (buckets, dataset) = (s.buckets.clone(), b.dataset.clone());
    let r = tokio::task::spawn_blocking(move || -> S3Result<()> {
        let _key = buckets.key_lock(&dataset, &k);
        let found = match &v {
            Some(v) => versions::find(&fs, &k, v),
            None => store::find(&fs, &k),
        }
        .map_err(s3_errno)?
        .ok_or_else(|| s3_error!(NoSuchKey, "The specified key does not exist."))?;
        let (retention, hold) = change(&found)?;
        store::set_lock(&fs, found.ino, retention, hold).map_err(s3_errno)?;
        Ok(())
    })
    .await
    .map_err(|e| s3_error!(InternalError, "{e}"))?;
    r
}

pub async fn put_object_retention(
    s: &TankS3,
    req: S3Request<PutObjectRetentionInput>,
) -> S3Result<S3Response<PutObjectRetentionOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let bypass = i.bypass_governance_retention.unwrap_or(false) && p.is_admin();
    let next = match i.retention {
        None => None,
        Some(r) => match (r.mode, r.retain_until_date) {
            (None, None) => None,
            (Some(m), Some(d)) => {
                let m = m.as_str().to_string();
                if m != "GOVERNANCE" && m != "COMPLIANCE" {
                    return Err(s3_error!(MalformedXML, "Mode is GOVERNANCE or COMPLIANCE"));
                }
                let until = ms_of(&d);
                if until <= versions::now_ms() {
                    return Err(s3_error!(
                        InvalidArgument,
                        "The retain until date must be in the future!"
                    ));
                }
                Some(Retention { mode: m, until })
            }
            _ => {
                return Err(s3_error!(
                    MalformedXML,
                    "a retention has both a Mode and a RetainUntilDate"
                ))
            }
        },
    };
    change_lock(
        s,
        &p,
        &i.bucket,
        &i.key,
        i.version_id.as_deref(),
        move |o| {
            versions::may_set_retention(o, next.as_ref(), bypass)
                .map_err(|why| s3_error!(AccessDenied, "{why}"))?;
            Ok((next, o.legal_hold))
        },
    )
    .await?;
    Ok(S3Response::new(PutObjectRetentionOutput::default()))
}

pub async fn get_object_retention(
    s: &TankS3,
    req: S3Request<GetObjectRetentionInput>,
) -> S3Result<S3Response<GetObjectRetentionOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let o = lock_version(s, &p, &i.bucket, &i.key, i.version_id.as_deref()).await?;
    let r = o.retention.ok_or_else(|| {
        s3_error!(
            NoSuchObjectLockConfiguration,
            "The specified object does not have a ObjectLock configuration"
        )
    })?;
    Ok(S3Response::new(GetObjectRetentionOutput {
        retention: Some(ObjectLockRetention {
            mode: Some(ObjectLockRetentionMode::from(r.mode)),
            retain_until_date: Some(ts_ms(r.until)),
        }),
    }))
}

pub async fn put_object_legal_hold(
    s: &TankS3,
    req: S3Request<PutObjectLegalHoldInput>,
) -> S3Result<S3Response<PutObjectLegalHoldOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let on = match i
        .legal_hold
        .and_then(|h| h.status)
        .as_ref()
        .map(|x| x.as_str())
    {
        Some("ON") => true,
        Some("OFF") => false,
        _ => {
            return Err(s3_error!(
                MalformedXML,
                "a legal hold's Status is ON or OFF"
            ))
        }
    };
    change_lock(
        s,
        &p,
        &i.bucket,
        &i.key,
        i.version_id.as_deref(),
        move |o| Ok((o.retention.clone(), on)),
    )
    .await?;
    Ok(S3Response::new(PutObjectLegalHoldOutput::default()))
}

pub async fn get_object_legal_hold(
    s: &TankS3,
    req: S3Request<GetObjectLegalHoldInput>,
) -> S3Result<S3Response<GetObjectLegalHoldOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let i = req.input;
    let o = lock_version(s, &p, &i.bucket, &i.key, i.version_id.as_deref()).await?;
    Ok(S3Response::new(GetObjectLegalHoldOutput {
        legal_hold: Some(ObjectLockLegalHold {
            status: Some(ObjectLockLegalHoldStatus::from_static(if o.legal_hold {
                "ON"
            } else {
                "OFF"
            })),
        }),
    }))
}

/// The error of a lock request to a bucket without Object Lock.
fn no_lock() -> s3s::S3Error {
    s3_error!(
        InvalidRequest,
        "Bucket is missing Object Lock Configuration"
    )
}

/// The version a lock read asks for, in a bucket with Object Lock that `p` may read.
async fn lock_version(
    s: &TankS3,
    p: &crate::buckets::Principal,
    bucket: &str,
    key: &str,
    version: Option<&str>,
) -> S3Result<store::Obj> {
    crate::ops::check_key(key)?;
    let (b, fs) = s.bucket(bucket, p, false)?;
    if !b.object_lock {
        return Err(no_lock());
    }
    s.find_version(&fs, key, version).await
}
