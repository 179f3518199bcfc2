//! The control protocol: one JSON object per line each way, after Kea's control channel.
//!
//! Request: `{"command": "status-get", "arguments": {...}, "version": 1}` (`arguments` and
//! `version` optional). Response: `{"result": 0, "text": "...", "arguments": {...}}` with the
//! result codes below. A line longer than [`MAX_REQUEST`] bytes is refused and the connection
//! closed; anything that is not such an object gets an error response, never a crash.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The protocol version this build speaks.
pub const VERSION: u64 = 1;
/// Longest request line accepted, newline included.
pub const MAX_REQUEST: usize = 64 * 1024;

/// Kea's result codes.
pub const SUCCESS: u8 = 0;
pub const ERROR: u8 = 1;
pub const UNSUPPORTED: u8 = 2;
pub const EMPTY: u8 = 3;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub command: String,
    #[serde(default)]
    pub arguments: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct Response {
    pub result: u8,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
}

impl Response {
    pub fn success(text: impl Into<String>, arguments: Value) -> Response {
        Response { result: SUCCESS, text: text.into(), arguments: Some(arguments) }
    }

    pub fn done(text: impl Into<String>) -> Response {
        Response { result: SUCCESS, text: text.into(), arguments: None }
    }

    pub fn error(text: impl Into<String>) -> Response {
        Response { result: ERROR, text: text.into(), arguments: None }
    }

    pub fn empty(text: impl Into<String>) -> Response {
        Response { result: EMPTY, text: text.into(), arguments: None }
    }

    pub fn unsupported(command: &str) -> Response {
        let text = format!("'{command}' is not supported here; 'list-commands' names those that are");
        Response { result: UNSUPPORTED, text, arguments: None }
    }

    /// One line of JSON, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("a response always serializes");
        v.push(b'\n');
        v
    }
}

/// Reads one request line. `Err` is the response to send instead of running anything.
pub fn parse(line: &[u8]) -> Result<Request, Response> {
    let r: Request = serde_json::from_slice(line)
        .map_err(|e| Response::error(format!("malformed request ({e}); send {{\"command\": \"list-commands\"}}")))?;
    match r.version {
        Some(v) if v != VERSION => {
            Err(Response::error(format!("protocol version {v} is not spoken here (only {VERSION})")))
        }
        _ => Ok(r),
    }
}

impl Request {
    pub fn new(command: &str, arguments: Map<String, Value>) -> Request {
        Request { command: command.to_string(), arguments, version: Some(VERSION) }
    }

    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("a request always serializes");
        v.push(b'\n');
        v
    }

    /// A string argument, if given.
    pub fn text(&self, key: &str) -> Result<Option<&str>, Response> {
        match self.arguments.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(Response::error(format!("argument '{key}' must be a string"))),
        }
    }

    /// A whole-number argument, if given.
    pub fn number(&self, key: &str) -> Result<Option<u64>, Response> {
        match self.arguments.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_u64().map(Some).ok_or_else(|| Response::error(format!("argument '{key}' must be a whole number")))
            }
        }
    }

    /// A boolean argument, false if absent.
    pub fn flag(&self, key: &str) -> Result<bool, Response> {
        match self.arguments.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(Response::error(format!("argument '{key}' must be true or false"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_get_an_error_object() {
        let r = parse(br#"{"command": "status-get"}"#).unwrap();
        assert_eq!((r.command.as_str(), r.arguments.len(), r.version), ("status-get", 0, None));
        let r = parse(br#"{"command": "lease-get", "arguments": {"address": "198.18.0.9"}, "version": 1}"#).unwrap();
        assert_eq!(r.text("address").unwrap(), Some("198.18.0.9"));
        assert!(r.text("hostname").unwrap().is_none());
        for bad in [&b"not json"[..], b"{}", b"[1,2]", br#"{"command": 7}"#, br#"{"command": "x", "extra": 1}"#] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.result, ERROR, "{}", String::from_utf8_lossy(bad));
        }
        let e = parse(br#"{"command": "status-get", "version": 2}"#).unwrap_err();
        assert!(e.text.contains("version 2"));
        let line = Response::success("ok", serde_json::json!({"a": 1})).to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        let back: Response = serde_json::from_slice(&line).unwrap();
        assert_eq!(back.result, SUCCESS);
    }
}
