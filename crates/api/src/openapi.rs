//! The OpenAPI document of the API, generated from the service's own types.
//!
//! # Theory of operation
//! The request and response types of `tank_service::api` derive their JSON schemas
//! (utoipa). Every request is a variant of one enum tagged by `op`; this module splits its
//! schema into one operation per request, `POST /api/v1/{op}` with that variant's fields
//! as the body, so the document lists exactly the requests the service takes. The fixed
//! routes (login, logout, session, the read shortcuts, the event stream, the metrics, this
//! document) are added beside them. A test validates the document and checks every route
//! of the router against it.

use serde_json::{json, Map, Value};
use tank_service::api::{Request, Response};
use utoipa::{PartialSchema, ToSchema};

/// Fixed routes: (method, path, summary, response description).
pub const FIXED: &[(&str, &str, &str)] = &[
    (
        "post",
        "/api/v1/login",
        "Log in with a password: a session cookie and a CSRF token",
    ),
    ("post", "/api/v1/logout", "End the session"),
    (
        "get",
        "/api/v1/session",
        "Who the caller is (the hello request)",
    ),
    ("get", "/api/v1/pools", "The imported pools (pool_list)"),
    (
        "get",
        "/api/v1/pools/{name}",
        "A pool's status (pool_status)",
    ),
    ("get", "/api/v1/datasets", "Every dataset (dataset_list)"),
    ("get", "/api/v1/shares", "Every share (share_list)"),
    (
        "get",
        "/api/v1/jobs",
        "Long-running work with progress (job_list)",
    ),
    ("get", "/api/v1/jobs/{id}", "One job (job_get)"),
    (
        "get",
        "/api/v1/events",
        "Pool events and I/O statistics as server-sent events",
    ),
    ("get", "/api/openapi.json", "This document"),
    (
        "get",
        "/",
        "The web console (with a session; else a redirect to /login)",
    ),
    ("get", "/login", "The web console's login page"),
    (
        "get",
        "/console/{name}",
        "A file of the web console (script, style, chart library, icon)",
    ),
    ("get", "/metrics", "Metrics in the Prometheus text format"),
];

/// The schema of every request, by op name, without the `op` tag.
pub fn request_schemas() -> Vec<(String, Value)> {
    let schema = serde_json::to_value(Request::schema()).unwrap_or(Value::Null);
    let mut out = Vec::new();
    for variant in schema["oneOf"].as_array().cloned().unwrap_or_default() {
        let mut v = variant.clone();
        let op = v["properties"]["op"]["enum"][0]
            .as_str()
            .map(String::from)
            .unwrap_or_default();
        if op.is_empty() {
            continue;
        }
        if let Some(p) = v["properties"].as_object_mut() {
            p.remove("op");
        }
        if let Some(r) = v["required"].as_array_mut() {
            r.retain(|x| x != "op");
        }
        out.push((op, v));
    }
    out
}

/// The names of every request the service takes.
pub fn ops() -> Vec<String> {
    request_schemas().into_iter().map(|(op, _)| op).collect()
}

fn error_responses() -> Value {
    json!({
        "400": {"description": "a malformed or invalid request", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}},
        "401": {"description": "not authenticated (no, an expired or a revoked session or token)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}},
        "403": {"description": "the caller may not do this", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}},
        "404": {"description": "no such thing", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}},
        "409": {"description": "it exists already, or is busy", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}},
        "500": {"description": "the operation failed", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorReply"}}}}
    })
}

fn ok_response() -> Value {
    json!({"description": "done", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OkReply"}}}})
}

/// The whole document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for (op, schema) in request_schemas() {
        let mut responses = error_responses();
        responses["200"] = ok_response();
        paths.insert(
            format!("/api/v1/{op}"),
            json!({"post": {
                "operationId": op,
                "summary": format!("The {op} request"),
                "tags": [op.split('_').next().unwrap_or("misc")],
                "requestBody": {"required": false, "content": {"application/json": {"schema": schema}}},
                "responses": responses,
            }}),
        );
    }
    for (method, path, summary) in FIXED {
        let mut responses = error_responses();
        responses["200"] = match *path {
            "/metrics" => {
                json!({"description": "metrics", "content": {"application/openmetrics-text": {"schema": {"type": "string"}}}})
            }
            "/api/v1/events" => {
                json!({"description": "an event stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}})
            }
            "/api/openapi.json" => {
                json!({"description": "this document", "content": {"application/json": {"schema": {"type": "object"}}}})
            }
            "/" | "/login" => {
                json!({"description": "a page", "content": {"text/html": {"schema": {"type": "string"}}}})
            }
            "/console/{name}" => {
                json!({"description": "a file", "content": {"*/*": {"schema": {"type": "string"}}}})
            }
            _ => ok_response(),
        };
        let mut op = json!({
            "operationId": path.trim_start_matches('/').replace(['/', '{', '}', '.'], "_") + "_" + method,
            "summary": summary,
            "responses": responses,
        });
        let params: Vec<Value> = path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        if *path == "/api/v1/login" {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": {
                "type": "object", "required": ["user", "password"],
                "properties": {"user": {"type": "string"}, "password": {"type": "string"}}}}}});
        }
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[*method] = op;
    }
    let mut schemas = Vec::new();
    <Response as ToSchema>::schemas(&mut schemas);
    let mut components: Map<String, Value> = schemas
        .into_iter()
        .map(|(name, s)| (name, serde_json::to_value(s).unwrap_or(Value::Null)))
        .collect();
    components.insert(
        "Response".into(),
        serde_json::to_value(Response::schema()).unwrap_or(Value::Null),
    );
    components.insert(
        "OkReply".into(),
        json!({"type": "object", "required": ["ok"], "properties": {"ok": {
            "type": "object", "required": ["response"], "properties": {
                "response": {"$ref": "#/components/schemas/Response"},
                "notes": {"type": "array", "items": {"type": "string"}}}}}}),
    );
    components.insert(
        "ErrorReply".into(),
        json!({"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["kind", "message"], "properties": {
                "kind": {"type": "string", "enum": ["not_found", "exists", "invalid", "denied",
                    "unauthenticated", "store", "busy", "no_space", "failed", "bad_request"]},
                "message": {"type": "string"}}}}}),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "tank management API",
            "version": format!("{}", tank_service::API_VERSION),
            "description": "Every management request of the tank service. Authenticate with a session (POST /api/v1/login; send X-CSRF-Token with changes) or an API token (Authorization: Bearer)."
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": crate::auth::COOKIE}
            }
        },
        "security": [{"bearer": []}, {"session": []}],
        "paths": paths,
    })
}
