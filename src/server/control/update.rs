//! The control socket's `update-status`, `update-install` and `update-pair`: passed on to the
//! firmware image's update socket (`[control] update_socket`), where a root process checks and
//! writes bundles. The daemon's unit gives it no access to disks, so it only relays: the
//! request goes over as the arguments `twinlease update` would send (src/update/socket.rs), and
//! the answer carries the root side's output and exit status. What an update does and refuses
//! is decided there (src/cli/update.rs), not here.

use std::path::Path;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use super::protocol::{ERROR, Request, Response};
use crate::update::socket::{PROGRESS_PREFIX, exit_status};

/// Output lines kept for the answer (a pair roll says a few dozen); a root side that says more
/// keeps its last ones.
const MAX_LINES: usize = 500;

/// What the root side said and how it ended.
#[derive(Debug)]
struct Answer {
    exit: u8,
    output: Vec<String>,
}

/// `update-status`: both slots as `twinlease update status --json` reports them.
pub(super) async fn status(socket: &Path) -> Response {
    let answer = match relay(socket, &["status".into(), "--json".into()]).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    if answer.exit != 0 {
        return refused(answer);
    }
    match serde_json::from_str::<Value>(&answer.output.join("\n")) {
        Ok(slots) => Response::success(summary(&slots), slots),
        Err(e) => Response::error(format!("the update socket's status is not JSON: {e}")),
    }
}

/// `update-install`: "bundle" (a full path on the box), "key" (optional), "reboot" (into the
/// new slot once it is written; the answer may then not arrive).
pub(super) async fn install(socket: &Path, req: &Request) -> Response {
    let args = bundle_args("install", req).and_then(|mut args| {
        if req.flag("reboot")? {
            args.push("--reboot".into());
        }
        Ok(args)
    });
    match args {
        Ok(args) => finished(relay(socket, &args).await),
        Err(r) => r,
    }
}

/// `update-pair`: "bundle", "key" (optional), "timeout" (seconds each box has to come back;
/// optional). The roll runs with the daemon's own configuration file, so it finds the partner
/// this daemon syncs with. Both boxes reboot during the roll: the answer comes only if it stops
/// before this box goes down.
pub(super) async fn pair(socket: &Path, config: &Path, req: &Request) -> Response {
    let args = bundle_args("pair", req).and_then(|mut args| {
        let config = std::path::absolute(config).unwrap_or_else(|_| config.to_path_buf());
        args.extend(["--config".into(), config.display().to_string()]);
        if let Some(secs) = req.number("timeout")? {
            args.extend(["--timeout".into(), secs.to_string()]);
        }
        Ok(args)
    });
    match args {
        Ok(args) => finished(relay(socket, &args).await),
        Err(r) => r,
    }
}

/// `VERB BUNDLE [--key KEY]`, both full paths: the root side does not run where the caller does.
fn bundle_args(verb: &str, req: &Request) -> Result<Vec<String>, Response> {
    let full_path = |key: &str, value: Option<&str>| match value {
        Some(p) if p.starts_with('/') => Ok(Some(p.to_string())),
        Some(p) => Err(Response::error(format!("argument '{key}' must be a full path on the box, not {p:?}"))),
        None => Ok(None),
    };
    let bundle = full_path("bundle", req.text("bundle")?)?
        .ok_or_else(|| Response::error("give \"bundle\": the bundle file's full path on the box"))?;
    let mut args = vec![verb.to_string(), bundle];
    if let Some(key) = full_path("key", req.text("key")?)? {
        args.extend(["--key".into(), key]);
    }
    Ok(args)
}

/// Sends one request to the update socket and reads its answer to the end.
async fn relay(socket: &Path, args: &[String]) -> Result<Answer, Response> {
    let unreachable = |e: std::io::Error| {
        Response::error(format!(
            "cannot reach the update socket {} ({e}); it is part of the firmware image (twinlease-update.socket)",
            socket.display()
        ))
    };
    let mut stream = UnixStream::connect(socket).await.map_err(unreachable)?;
    let mut line = serde_json::to_vec(args).expect("strings serialize");
    line.push(b'\n');
    stream.write_all(&line).await.map_err(unreachable)?;
    let mut lines = BufReader::new(stream).lines();
    let mut output = Vec::new();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                if let Some(exit) = exit_status(&line) {
                    return Ok(Answer { exit, output });
                }
                if output.len() == MAX_LINES {
                    output.remove(0);
                }
                output.push(line);
            }
            Ok(None) => {
                let last = output.last().map_or(String::new(), |l| format!(" after: {l}"));
                return Err(Response::error(format!("the update socket closed before its exit status{last}")));
            }
            Err(e) => return Err(Response::error(format!("reading the update socket: {e}"))),
        }
    }
}

/// An install's or a roll's answer: its last line as the text, all of it in the arguments.
fn finished(answer: Result<Answer, Response>) -> Response {
    match answer {
        Ok(a) if a.exit == 0 => {
            let text = last_line(&a);
            Response::success(text, json!({"exit-status": a.exit, "output": a.output}))
        }
        Ok(a) => refused(a),
        Err(r) => r,
    }
}

fn refused(a: Answer) -> Response {
    let text = last_line(&a);
    Response { result: ERROR, text, arguments: Some(json!({"exit-status": a.exit, "output": a.output})) }
}

fn last_line(a: &Answer) -> String {
    let last = a.output.iter().rev().find(|l| !l.trim().is_empty());
    match last {
        Some(l) => l.strip_prefix(PROGRESS_PREFIX).unwrap_or(l).to_string(),
        None => format!("exit status {}", a.exit),
    }
}

/// "slot a: 1.0, good, booted; slot b: 2.0, on trial" from `update status --json`.
fn summary(slots: &Value) -> String {
    let Some(list) = slots["slots"].as_array() else { return "no slots".to_string() };
    let one = |s: &Value| {
        let mut words = vec![s["version"].as_str().unwrap_or("no version").to_string()];
        words.push(match (s["state"].as_str(), s["tries_left"].as_u64()) {
            (Some("trying"), Some(left)) => format!("on trial ({left} boots left)"),
            (Some(state), _) => state.to_string(),
            (None, _) => "no boot entry".to_string(),
        });
        if s["booted"].as_bool() == Some(true) {
            words.push("booted".into());
        }
        if s["slot"] == slots["next_boot"] && s["booted"].as_bool() != Some(true) {
            words.push("boots next".into());
        }
        format!("slot {}: {}", s["slot"].as_str().unwrap_or("?"), words.join(", "))
    };
    let mut text = list.iter().map(one).collect::<Vec<_>>().join("; ");
    if let Some(from) = slots["rollback"]["from_slot"].as_str() {
        text.push_str(&format!("; rolled back from slot {from}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::protocol::SUCCESS;
    use super::*;
    use serde_json::Map;

    fn request(args: Value) -> Request {
        let Value::Object(map) = args else { panic!("an object") };
        Request::new("update-install", map)
    }

    #[test]
    fn bundles_and_keys_go_over_as_full_paths() {
        let r = request(json!({"bundle": "/var/lib/twinlease-bundles/x.bundle", "key": "/k.pem"}));
        assert_eq!(
            bundle_args("install", &r).unwrap(),
            ["install", "/var/lib/twinlease-bundles/x.bundle", "--key", "/k.pem"]
        );
        for bad in [json!({}), json!({"bundle": "x.bundle"}), json!({"bundle": 7}), json!({"bundle": "/b", "key": "k"})]
        {
            let e = bundle_args("install", &request(bad.clone())).unwrap_err();
            assert_eq!(e.result, ERROR, "{bad}");
        }
        assert!(bundle_args("pair", &Request::new("update-pair", Map::new())).is_err());
    }

    #[test]
    fn an_answer_says_its_last_line_and_keeps_the_output() {
        let a = Answer {
            exit: 0,
            output: vec!["twinlease-update: checked".into(), "twinlease-update: slot b written".into()],
        };
        let r = finished(Ok(a));
        assert_eq!((r.result, r.text.as_str()), (SUCCESS, "slot b written"));
        assert_eq!(r.arguments.unwrap()["output"].as_array().unwrap().len(), 2);
        let r = finished(Ok(Answer { exit: 1, output: vec![] }));
        assert_eq!((r.result, r.text.as_str()), (ERROR, "exit status 1"));
    }

    #[test]
    fn the_status_summary_names_each_slot() {
        let slots = json!({"booted": "a", "slots": [
            {"slot": "a", "version": "1.0", "state": "good", "booted": true},
            {"slot": "b", "version": null, "state": null, "booted": false}],
            "rollback": {"from_slot": "b"}});
        assert_eq!(
            summary(&slots),
            "slot a: 1.0, good, booted; slot b: no version, no boot entry; rolled back from slot b"
        );
    }

    #[tokio::test]
    async fn no_update_socket_is_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let r = status(&dir.path().join("none.sock")).await;
        assert_eq!(r.result, ERROR);
        assert!(r.text.contains("twinlease-update.socket"), "{}", r.text);
    }
}
