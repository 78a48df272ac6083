//! Bad input: always a JSON 4xx, never a claim, never an upstream contact.

use serde_json::{Value, json};

use crate::helpers::*;

async fn assert_refused(app: &TestApp, up: &TestUpstream, body: Vec<u8>, expected: u16) -> Value {
    let resp = app.route_raw(Some(&new_key()), body.clone()).await;
    assert_eq!(resp.status(), expected, "body {:?}", String::from_utf8_lossy(&body[..body.len().min(200)]));
    assert!(resp.headers().get("content-type").unwrap().to_str().unwrap().contains("application/json"));
    let err: Value = resp.json().await.unwrap();
    assert!(err["error"].is_string(), "{err}");
    assert_eq!(app.idempotency_rows().await, 0, "no claim may be written");
    assert_eq!(up.hits.total(), 0, "the upstream must not be contacted");
    err
}

#[actix_web::test]
async fn malformed_bodies_are_refused_before_any_claim() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let ok_url = up.url("/ok");
    let cases: Vec<String> = vec![
        "not json".into(),
        "".into(),
        "[1,2]".into(),
        format!(r#"{{"url":"{ok_url}","url":"{ok_url}"}}"#),
        format!(r#"{{"url":"{ok_url}","method":"POST","body":{{"a":1,"a":2}}}}"#),
        format!(r#"{{"url":"{ok_url}","method":"POST","body":{{"n":9007199254740993}}}}"#),
        format!(r#"{{"url":"{ok_url}","method":"POST","body":"\ud800"}}"#),
        r#"{"url":"not a url"}"#.into(),
        r#"{"url":"ftp://127.0.0.1/x"}"#.into(),
        r#"{"url":"file:///etc/passwd"}"#.into(),
        format!(r#"{{"url":"{ok_url}","method":"TRACE"}}"#),
        format!(r#"{{"url":"{ok_url}","method":7}}"#),
        format!(r#"{{"url":"{ok_url}","headers":{{"bad header":"x"}}}}"#),
        format!(r#"{{"url":"{ok_url}","headers":{{"x-a":"line\nbreak"}}}}"#),
        format!(r#"{{"url":"{ok_url}","headers":["x"]}}"#),
        format!(r#"{{"url":"{ok_url}","max_amount":50000}}"#),
        format!(r#"{{"url":"{ok_url}","max_amount":"5e4"}}"#),
        format!(r#"{{"url":"{ok_url}","surprise":true}}"#),
        format!(r#"{{"url":"{ok_url}","body":{{"x":1}}}}"#),
    ];
    for body in cases {
        assert_refused(&app, &up, body.into_bytes(), 400).await;
    }
    let invalid_utf8 = [br#"{"url":""#.as_slice(), &[0xff, 0xfe], br#""}"#].concat();
    assert_refused(&app, &up, invalid_utf8, 400).await;
}

#[actix_web::test]
async fn huge_body_is_413_json() {
    let app = spawn_app_with(AppOptions { request_max_bytes: 4096, ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let body = json!({"url": up.url("/ok"), "method": "POST", "body": {"pad": "x".repeat(10_000)}});
    let err = assert_refused(&app, &up, body.to_string().into_bytes(), 413).await;
    assert!(err["error"].as_str().unwrap().contains("4096"));
}

#[actix_web::test]
async fn ssrf_targets_are_refused_in_every_spelling() {
    let app = spawn_app_with(AppOptions { allow_private: false, ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let p = up.port;
    let targets = [
        format!("http://127.0.0.1:{p}/ok"),
        format!("http://localhost:{p}/ok"),
        format!("http://2130706433:{p}/ok"),
        format!("http://0x7f000001:{p}/ok"),
        format!("http://0177.0.0.1:{p}/ok"),
        format!("http://127.1:{p}/ok"),
        format!("http://[::ffff:127.0.0.1]:{p}/ok"),
        format!("http://[::1]:{p}/ok"),
        format!("http://0.0.0.0:{p}/ok"),
        format!("http://0:{p}/ok"),
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://[::ffff:169.254.169.254]/latest/meta-data/".into(),
        "http://10.0.0.1/".into(),
        "http://192.168.0.1/".into(),
        "http://100.64.0.1/".into(),
        "http://[fd00::1]/".into(),
    ];
    for url in targets {
        let err = assert_refused(&app, &up, json!({"url": url}).to_string().into_bytes(), 400).await;
        assert!(err["error"].as_str().unwrap().contains("not allowed"), "{url}: {err}");
    }
}

#[actix_web::test]
async fn unknown_paths_and_methods_get_json_errors() {
    let app = spawn_app().await;
    let resp = app.client.get(format!("{}/nope", app.address)).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"], "not found");
    assert_eq!(err["code"], "not_found");
    let resp = app.client.get(format!("{}/route", app.address)).send().await.unwrap();
    assert!(resp.status().is_client_error());
    assert!(resp.json::<Value>().await.unwrap()["error"].is_string());
}
