//! The S3 operations on a bucket's settings: tagging, the anonymous-read policy, CORS and
//! lifecycle rules.
//!
//! # Theory of operation
//! Tags, CORS rules and lifecycle rules are kept with the bucket's dataset as bucket
//! settings (`store::bucket_conf`, attributes of `.tank-s3`), in tank's own JSON form, so
//! that they move with the pool and survive restarts. A bucket policy is not a general
//! policy language here: who may use a bucket is the share's `users` and `groups`, and the
//! one policy served is the one S3 users set most, anonymous read. PutBucketPolicy accepts a
//! policy that allows `*` to `s3:GetObject` on the bucket's objects (and optionally
//! `s3:ListBucket` on the bucket) and nothing else, and sets the share's `public` option
//! (`objects`, or `read` with listing); any other policy is refused with MalformedPolicy
//! saying so. The settings are changed by the bucket's users and administrators and read
//! by whoever may read the bucket. CORS rules are applied to browsers' requests in
//! `cors.rs`, lifecycle rules by the worker in `lifecycle.rs`.

use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};
use serde::{Deserialize, Serialize};

use crate::ops::{ms_of, s3_errno, ts_ms, TankS3};
use crate::store::{self, blocking};

/// At most this many tags on a bucket (S3's limit).
const MAX_BUCKET_TAGS: usize = 50;
/// At most this many CORS and lifecycle rules (S3's limits).
const MAX_CORS_RULES: usize = 100;
const MAX_LIFECYCLE_RULES: usize = 1000;

/// One CORS rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorsRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub origins: Vec<String>,
    pub methods: Vec<String>,
    #[serde(default)]
    pub headers: Vec<String>,
    #[serde(default)]
    pub expose: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<i32>,
}

/// One lifecycle rule (expirations only: there are no storage classes to move to).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub enabled: bool,
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub tags: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_gt: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_lt: Option<i64>,
    /// Current objects expire this many days after they were written...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_days: Option<i32>,
    /// ...or from this date (milliseconds since 1970).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_date: Option<i64>,
    /// A delete marker with no version left below it goes.
    #[serde(default)]
    pub expired_markers: bool,
    /// Noncurrent versions go this many days after they stopped being current...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noncurrent_days: Option<i32>,
    /// ...keeping this many newer noncurrent versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_noncurrent: Option<i32>,
    /// Multipart uploads not completed this many days after they began are aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_days: Option<i32>,
}

/// A bucket setting, read as `T`.
pub fn conf<T: for<'de> Deserialize<'de>>(
    fs: &tank_dataset::posix::Fs,
    what: &str,
) -> store::Res<Option<T>> {
    Ok(store::bucket_conf(fs, what)?.and_then(|v| serde_json::from_slice(&v).ok()))
}

fn tags_in(set: &[Tag], max: usize) -> S3Result<Vec<(String, String)>> {
    if set.len() > max {
        return Err(s3_error!(InvalidTag, "at most {max} tags"));
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for t in set {
        let k = t.key.clone().unwrap_or_default();
        let v = t.value.clone().unwrap_or_default();
        if k.is_empty() || k.len() > 128 || v.len() > 256 {
            return Err(s3_error!(
                InvalidTag,
                "a tag's key is 1 to 128 characters and its value at most 256"
            ));
        }
        if k.starts_with("aws:") {
            return Err(s3_error!(
                InvalidTag,
                "tag keys starting with aws: are reserved"
            ));
        }
        if out.iter().any(|(x, _)| *x == k) {
            return Err(s3_error!(
                InvalidTag,
                "Cannot provide multiple Tags with the same key"
            ));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn tag_set(tags: &[(String, String)]) -> TagSet {
    tags.iter()
        .map(|(k, v)| Tag {
            key: Some(k.clone()),
            value: Some(v.clone()),
        })
        .collect()
}

impl TankS3 {
    /// Writes a bucket setting (None: removes it) for a caller who may change the bucket.
    async fn put_conf(
        &self,
        p: &crate::buckets::Principal,
        bucket: &str,
        what: &'static str,
        value: Option<Vec<u8>>,
    ) -> S3Result<()> {
        let (_b, fs) = self.bucket(bucket, p, true)?;
        blocking(fs, move |f| {
            store::set_bucket_conf(f, what, value.as_deref())
        })
        .await
        .map_err(s3_errno)
    }

    /// Reads a bucket setting for a caller who may read the bucket.
    async fn get_conf<T: for<'de> Deserialize<'de> + Send + 'static>(
        &self,
        p: &crate::buckets::Principal,
        bucket: &str,
        what: &'static str,
    ) -> S3Result<Option<T>> {
        let (_b, fs) = self.bucket(bucket, p, false)?;
        blocking(fs, move |f| conf::<T>(f, what))
            .await
            .map_err(s3_errno)
    }
}

pub async fn put_bucket_tagging(
    s: &TankS3,
    req: S3Request<PutBucketTaggingInput>,
) -> S3Result<S3Response<PutBucketTaggingOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let tags = tags_in(&req.input.tagging.tag_set, MAX_BUCKET_TAGS)?;
    let v = serde_json::to_vec(&tags).expect("tags serialize");
    s.put_conf(&p, &req.input.bucket, "tagging", Some(v))
        .await?;
    Ok(S3Response::new(PutBucketTaggingOutput::default()))
}

pub async fn get_bucket_tagging(
    s: &TankS3,
    req: S3Request<GetBucketTaggingInput>,
) -> S3Result<S3Response<GetBucketTaggingOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let tags: Vec<(String, String)> = s
        .get_conf(&p, &req.input.bucket, "tagging")
        .await?
        .ok_or_else(|| s3_error!(NoSuchTagSet, "The TagSet does not exist"))?;
    Ok(S3Response::new(GetBucketTaggingOutput {
        tag_set: tag_set(&tags),
    }))
}

pub async fn delete_bucket_tagging(
    s: &TankS3,
    req: S3Request<DeleteBucketTaggingInput>,
) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    s.put_conf(&p, &req.input.bucket, "tagging", None).await?;
    Ok(S3Response::new(DeleteBucketTaggingOutput::default()))
}

/// What an anonymous-read policy allows: (objects, listing). Any other policy is refused.
pub fn anonymous_read(bucket: &str, text: &str) -> Result<(bool, bool), String> {
    let refuse = |why: &str| {
        Err(format!(
            "{why}: tank serves one kind of bucket policy, anonymous read (Allow, Principal \"*\", s3:GetObject on arn:aws:s3:::{bucket}/* and optionally s3:ListBucket on arn:aws:s3:::{bucket}); give accounts access with the share's users and groups"
        ))
    };
    let v: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(format!("the policy is not JSON: {e}")),
    };
    let statements = match v.get("Statement") {
        Some(serde_json::Value::Array(a)) => a.clone(),
        Some(o @ serde_json::Value::Object(_)) => vec![o.clone()],
        _ => return refuse("no Statement"),
    };
    let strings = |x: Option<&serde_json::Value>| -> Option<Vec<String>> {
        match x? {
            serde_json::Value::String(s) => Some(vec![s.clone()]),
            serde_json::Value::Array(a) => {
                a.iter().map(|e| e.as_str().map(str::to_string)).collect()
            }
            _ => None,
        }
    };
    let (mut objects, mut list) = (false, false);
    let objects_arn = format!("arn:aws:s3:::{bucket}/*");
    let bucket_arn = format!("arn:aws:s3:::{bucket}");
    for st in &statements {
        let Some(obj) = st.as_object() else {
            return refuse("a statement is not an object");
        };
        for k in obj.keys() {
            if !["Sid", "Effect", "Principal", "Action", "Resource"].contains(&k.as_str()) {
                return refuse(&format!("'{k}' is not served"));
            }
        }
        if st.get("Effect").and_then(|e| e.as_str()) != Some("Allow") {
            return refuse("only Allow statements are served");
        }
        let anyone = match st.get("Principal") {
            Some(serde_json::Value::String(s)) => s == "*",
            Some(p) => strings(p.get("AWS")).is_some_and(|a| a == ["*"]),
            None => false,
        };
        if !anyone {
            return refuse("the principal must be \"*\"");
        }
        let (Some(actions), Some(resources)) =
            (strings(st.get("Action")), strings(st.get("Resource")))
        else {
            return refuse("a statement needs an Action and a Resource");
        };
        for a in &actions {
            for r in &resources {
                match (a.as_str(), r.as_str()) {
                    ("s3:GetObject", r) if r == objects_arn => objects = true,
                    ("s3:ListBucket", r) if r == bucket_arn => list = true,
                    ("s3:GetBucketLocation", r) if r == bucket_arn => {}
                    _ => return refuse(&format!("{a} on {r} is not served")),
                }
            }
        }
    }
    if !objects {
        return refuse("s3:GetObject is not allowed");
    }
    Ok((objects, list))
}

/// The policy S3 would show for a bucket shared with `public` on.
fn canonical_policy(bucket: &str, list: bool) -> String {
    let mut statements = vec![serde_json::json!({
        "Effect": "Allow",
        "Principal": "*",
        "Action": "s3:GetObject",
        "Resource": format!("arn:aws:s3:::{bucket}/*"),
    })];
    if list {
        statements.push(serde_json::json!({
            "Effect": "Allow",
            "Principal": "*",
            "Action": "s3:ListBucket",
            "Resource": format!("arn:aws:s3:::{bucket}"),
        }));
    }
    serde_json::json!({"Version": "2012-10-17", "Statement": statements}).to_string()
}

pub async fn put_bucket_policy(
    s: &TankS3,
    req: S3Request<PutBucketPolicyInput>,
) -> S3Result<S3Response<PutBucketPolicyOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, _fs) = s.bucket(&req.input.bucket, &p, true)?;
    if req.input.policy.len() > 20 * 1024 {
        return Err(s3_error!(
            MalformedPolicy,
            "Policies must be no more than 20 KB"
        ));
    }
    let (_, list) = anonymous_read(&b.name, &req.input.policy)
        .map_err(|why| s3_error!(MalformedPolicy, "{why}"))?;
    let name = b.name.clone();
    drop(b);
    s.put_conf(
        &p,
        &name,
        "policy",
        Some(req.input.policy.clone().into_bytes()),
    )
    .await?;
    s.set_share(&name, &[("public", if list { "read" } else { "objects" })])
        .await?;
    Ok(S3Response::new(PutBucketPolicyOutput::default()))
}

pub async fn get_bucket_policy(
    s: &TankS3,
    req: S3Request<GetBucketPolicyInput>,
) -> S3Result<S3Response<GetBucketPolicyOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, fs) = s.bucket(&req.input.bucket, &p, false)?;
    if !b.public {
        return Err(s3_error!(
            NoSuchBucketPolicy,
            "The bucket policy does not exist"
        ));
    }
    let stored = blocking(fs, |f| store::bucket_conf(f, "policy"))
        .await
        .map_err(s3_errno)?
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|t| anonymous_read(&b.name, t) == Ok((true, b.public_list)));
    Ok(S3Response::new(GetBucketPolicyOutput {
        policy: Some(stored.unwrap_or_else(|| canonical_policy(&b.name, b.public_list))),
    }))
}

pub async fn delete_bucket_policy(
    s: &TankS3,
    req: S3Request<DeleteBucketPolicyInput>,
) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, _fs) = s.bucket(&req.input.bucket, &p, true)?;
    let name = b.name.clone();
    drop(b);
    s.put_conf(&p, &name, "policy", None).await?;
    s.set_share(&name, &[("public", "off")]).await?;
    Ok(S3Response::new(DeleteBucketPolicyOutput::default()))
}

pub async fn get_bucket_policy_status(
    s: &TankS3,
    req: S3Request<GetBucketPolicyStatusInput>,
) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let (b, _fs) = s.bucket(&req.input.bucket, &p, false)?;
    Ok(S3Response::new(GetBucketPolicyStatusOutput {
        policy_status: Some(PolicyStatus {
            is_public: Some(b.public),
        }),
    }))
}

pub async fn put_bucket_cors(
    s: &TankS3,
    req: S3Request<PutBucketCorsInput>,
) -> S3Result<S3Response<PutBucketCorsOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let rules = req.input.cors_configuration.cors_rules;
    if rules.is_empty() || rules.len() > MAX_CORS_RULES {
        return Err(s3_error!(MalformedXML, "1 to {MAX_CORS_RULES} CORS rules"));
    }
    let mut out = Vec::new();
    for r in rules {
        for m in &r.allowed_methods {
            if !["GET", "PUT", "POST", "DELETE", "HEAD"].contains(&m.as_str()) {
                return Err(s3_error!(
                    InvalidRequest,
                    "Found unsupported HTTP method in CORS config. Unsupported method is {m}"
                ));
            }
        }
        for o in &r.allowed_origins {
            if o.matches('*').count() > 1 {
                return Err(s3_error!(
                    InvalidRequest,
                    "AllowedOrigin \"{o}\" can not have more than one wildcard."
                ));
            }
        }
        out.push(CorsRule {
            id: r.id,
            origins: r.allowed_origins,
            methods: r.allowed_methods,
            headers: r.allowed_headers.unwrap_or_default(),
            expose: r.expose_headers.unwrap_or_default(),
            max_age: r.max_age_seconds,
        });
    }
    let v = serde_json::to_vec(&out).expect("rules serialize");
    s.put_conf(&p, &req.input.bucket, "cors", Some(v)).await?;
    Ok(S3Response::new(PutBucketCorsOutput::default()))
}

pub async fn get_bucket_cors(
    s: &TankS3,
    req: S3Request<GetBucketCorsInput>,
) -> S3Result<S3Response<GetBucketCorsOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let rules: Vec<CorsRule> = s
        .get_conf(&p, &req.input.bucket, "cors")
        .await?
        .ok_or_else(|| {
            s3_error!(
                NoSuchCORSConfiguration,
                "The CORS configuration does not exist"
            )
        })?;
    Ok(S3Response::new(GetBucketCorsOutput {
        cors_rules: Some(
            rules
                .into_iter()
                .map(|r| CORSRule {
                    id: r.id,
                    allowed_origins: r.origins,
                    allowed_methods: r.methods,
                    allowed_headers: (!r.headers.is_empty()).then_some(r.headers),
                    expose_headers: (!r.expose.is_empty()).then_some(r.expose),
                    max_age_seconds: r.max_age,
                })
                .collect(),
        ),
    }))
}

pub async fn delete_bucket_cors(
    s: &TankS3,
    req: S3Request<DeleteBucketCorsInput>,
) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    s.put_conf(&p, &req.input.bucket, "cors", None).await?;
    Ok(S3Response::new(DeleteBucketCorsOutput::default()))
}

pub async fn put_bucket_lifecycle_configuration(
    s: &TankS3,
    req: S3Request<PutBucketLifecycleConfigurationInput>,
) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let rules = req
        .input
        .lifecycle_configuration
        .map(|c| c.rules)
        .unwrap_or_default();
    if rules.is_empty() || rules.len() > MAX_LIFECYCLE_RULES {
        return Err(s3_error!(
            MalformedXML,
            "1 to {MAX_LIFECYCLE_RULES} lifecycle rules"
        ));
    }
    let mut out: Vec<LifecycleRule> = Vec::new();
    for r in rules {
        if r.transitions.as_ref().is_some_and(|t| !t.is_empty())
            || r.noncurrent_version_transitions
                .as_ref()
                .is_some_and(|t| !t.is_empty())
        {
            return Err(s3_error!(
                NotImplemented,
                "transitions are not served: a pool has one storage class"
            ));
        }
        let mut rule = LifecycleRule {
            id: r.id.clone(),
            enabled: r.status.as_str() == ExpirationStatus::ENABLED,
            prefix: r.prefix.clone().unwrap_or_default(),
            ..LifecycleRule::default()
        };
        if let Some(f) = &r.filter {
            if let Some(pf) = &f.prefix {
                rule.prefix = pf.clone();
            }
            if let Some(t) = &f.tag {
                rule.tags = tags_in(std::slice::from_ref(t), 1)?;
            }
            rule.size_gt = f.object_size_greater_than;
            rule.size_lt = f.object_size_less_than;
            if let Some(a) = &f.and {
                rule.prefix = a.prefix.clone().unwrap_or_default();
                rule.tags = tags_in(a.tags.as_deref().unwrap_or(&[]), 50)?;
                rule.size_gt = a.object_size_greater_than;
                rule.size_lt = a.object_size_less_than;
            }
        }
        if let Some(e) = &r.expiration {
            match (e.days, &e.date) {
                (Some(d), None) if d > 0 => rule.expire_days = Some(d),
                (None, Some(t)) => rule.expire_date = Some(ms_of(t)),
                (None, None) => {}
                _ => {
                    return Err(s3_error!(
                        InvalidArgument,
                        "an Expiration has a positive number of Days or a Date, not both"
                    ))
                }
            }
            rule.expired_markers = e.expired_object_delete_marker.unwrap_or(false);
            if rule.expired_markers && rule.tags.len() + usize::from(rule.size_gt.is_some()) > 0 {
                return Err(s3_error!(
                    InvalidArgument,
                    "ExpiredObjectDeleteMarker cannot be specified with tags or sizes"
                ));
            }
        }
        if let Some(n) = &r.noncurrent_version_expiration {
            match n.noncurrent_days {
                Some(d) if d > 0 => rule.noncurrent_days = Some(d),
                _ => {
                    return Err(s3_error!(
                        InvalidArgument,
                        "NoncurrentDays must be a positive integer"
                    ))
                }
            }
            rule.keep_noncurrent = n.newer_noncurrent_versions;
        }
        if let Some(a) = &r.abort_incomplete_multipart_upload {
            match a.days_after_initiation {
                Some(d) if d > 0 => rule.abort_days = Some(d),
                _ => {
                    return Err(s3_error!(
                        InvalidArgument,
                        "DaysAfterInitiation must be a positive integer"
                    ))
                }
            }
        }
        if rule.expire_days.is_none()
            && rule.expire_date.is_none()
            && !rule.expired_markers
            && rule.noncurrent_days.is_none()
            && rule.abort_days.is_none()
        {
            return Err(s3_error!(
                MalformedXML,
                "a lifecycle rule needs at least one action"
            ));
        }
        if rule.id.is_some() && out.iter().any(|o| o.id == rule.id) {
            return Err(s3_error!(InvalidArgument, "Rule ID must be unique"));
        }
        out.push(rule);
    }
    let v = serde_json::to_vec(&out).expect("rules serialize");
    s.put_conf(&p, &req.input.bucket, "lifecycle", Some(v))
        .await?;
    Ok(S3Response::new(
        PutBucketLifecycleConfigurationOutput::default(),
    ))
}

pub async fn get_bucket_lifecycle_configuration(
    s: &TankS3,
    req: S3Request<GetBucketLifecycleConfigurationInput>,
) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    let rules: Vec<LifecycleRule> = s
        .get_conf(&p, &req.input.bucket, "lifecycle")
        .await?
        .ok_or_else(|| {
            s3_error!(
                NoSuchLifecycleConfiguration,
                "The lifecycle configuration does not exist"
            )
        })?;
    let rules = rules
        .into_iter()
        .map(|r| {
            let tags = tag_set(&r.tags);
            let filter = if tags.len() > 1
                || (!tags.is_empty() && !r.prefix.is_empty())
                || r.size_gt.is_some()
                || r.size_lt.is_some()
            {
                LifecycleRuleFilter {
                    and: Some(LifecycleRuleAndOperator {
                        prefix: Some(r.prefix.clone()),
                        tags: Some(tags),
                        object_size_greater_than: r.size_gt,
                        object_size_less_than: r.size_lt,
                    }),
                    ..LifecycleRuleFilter::default()
                }
            } else if let Some(t) = tags.into_iter().next() {
                LifecycleRuleFilter {
                    tag: Some(t),
                    ..LifecycleRuleFilter::default()
                }
            } else {
                LifecycleRuleFilter {
                    prefix: Some(r.prefix.clone()),
                    ..LifecycleRuleFilter::default()
                }
            };
            s3s::dto::LifecycleRule {
                id: r.id,
                status: ExpirationStatus::from_static(if r.enabled {
                    ExpirationStatus::ENABLED
                } else {
                    ExpirationStatus::DISABLED
                }),
                filter: Some(filter),
                expiration: (r.expire_days.is_some()
                    || r.expire_date.is_some()
                    || r.expired_markers)
                    .then(|| LifecycleExpiration {
                        days: r.expire_days,
                        date: r.expire_date.map(ts_ms),
                        expired_object_delete_marker: r.expired_markers.then_some(true),
                    }),
                noncurrent_version_expiration: r.noncurrent_days.map(|d| {
                    NoncurrentVersionExpiration {
                        noncurrent_days: Some(d),
                        newer_noncurrent_versions: r.keep_noncurrent,
                    }
                }),
                abort_incomplete_multipart_upload: r.abort_days.map(|d| {
                    AbortIncompleteMultipartUpload {
                        days_after_initiation: Some(d),
                    }
                }),
                noncurrent_version_transitions: None,
                prefix: None,
                transitions: None,
            }
        })
        .collect();
    Ok(S3Response::new(GetBucketLifecycleConfigurationOutput {
        rules: Some(rules),
        ..GetBucketLifecycleConfigurationOutput::default()
    }))
}

pub async fn delete_bucket_lifecycle(
    s: &TankS3,
    req: S3Request<DeleteBucketLifecycleInput>,
) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
    let p = s.principal(req.credentials.as_ref())?;
    s.put_conf(&p, &req.input.bucket, "lifecycle", None).await?;
    Ok(S3Response::new(DeleteBucketLifecycleOutput::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_anonymous_read_policies_are_taken() {
        let ok = r#"{"Version":"2012-10-17","Statement":[{"Sid":"r","Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::b/*"]}]}"#;
        assert_eq!(anonymous_read("b", ok), Ok((true, false)));
        let list = r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"},{"Effect":"Allow","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b"}]}"#;
        assert_eq!(anonymous_read("b", list), Ok((true, true)));
        for bad in [
            r#"{"Statement":[{"Effect":"Deny","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::1:root"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{}}]}"#,
            r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b"}]}"#,
            "not json",
            "{}",
        ] {
            assert!(anonymous_read("b", bad).is_err(), "{bad}");
        }
    }
}
