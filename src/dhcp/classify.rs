//! Which `[[class]]`es a request belongs to. The classes were compiled when the configuration
//! loaded; here the request's bytes are only compared with them.

use dhcproto::v4::{DhcpOption, OptionCode};

use super::decide::Ingress;
use super::inbound::Request;
use crate::config::{Class, ClassSet, Pattern};

/// What a request offers to match on, borrowed from the decoded message.
#[derive(Debug, Clone, Copy, Default)]
pub struct Facts<'a> {
    pub vendor_class: Option<&'a [u8]>,
    pub user_class: Option<&'a [u8]>,
    pub hw: &'a [u8],
    /// Option 82 as received: code, length, sub-options.
    pub relay_info: Option<&'a [u8]>,
    pub interface: Option<usize>,
    pub giaddr: Option<std::net::Ipv4Addr>,
}

impl<'a> Facts<'a> {
    pub fn of(req: &'a Request, ing: &Ingress) -> Facts<'a> {
        let opts = req.msg.opts();
        let vendor_class = match opts.get(OptionCode::ClassIdentifier) {
            Some(DhcpOption::ClassIdentifier(v)) => Some(v.as_slice()),
            _ => None,
        };
        let user_class = match opts.get(OptionCode::UserClass) {
            Some(DhcpOption::UserClass(v)) => Some(v.as_slice()),
            _ => None,
        };
        let giaddr = Some(req.msg.giaddr()).filter(|g| !g.is_unspecified());
        Facts {
            vendor_class,
            user_class,
            hw: &req.hw,
            relay_info: req.relay_info.as_deref(),
            interface: if giaddr.is_none() { ing.interface } else { None },
            giaddr,
        }
    }
}

/// The classes `facts` belong to.
pub fn classify(classes: &[Class], facts: &Facts) -> ClassSet {
    let mut set = ClassSet::EMPTY;
    for (i, c) in classes.iter().enumerate() {
        if matches(c, facts) {
            set = set.with(i);
        }
    }
    set
}

/// Every match the class gives must hold; within one, any pattern will do.
pub fn matches(c: &Class, f: &Facts) -> bool {
    let any = |patterns: &[Pattern], data: Option<&[u8]>| {
        patterns.is_empty() || data.is_some_and(|d| patterns.iter().any(|p| p.matches(d)))
    };
    any(&c.vendor_class, f.vendor_class)
        && (c.user_class.is_empty() || f.user_class.is_some_and(|d| user_class_matches(&c.user_class, d)))
        && (c.hw_prefix.is_empty() || c.hw_prefix.iter().any(|p| f.hw.starts_with(p)))
        && any(&c.circuit_id, f.relay_info.and_then(|r| relay_sub_option(r, 1)))
        && any(&c.remote_id, f.relay_info.and_then(|r| relay_sub_option(r, 2)))
        && (c.interfaces.is_empty() || f.interface.is_some_and(|i| c.interfaces.contains(&i)))
        && (c.relays.is_empty() || f.giaddr.is_some_and(|g| c.relays.iter().any(|n| n.contains(&g))))
}

/// Option 77 is a list of user classes, each with a length byte (RFC 3004), but many clients
/// (ISC dhclient, Windows, iPXE) send one bare string: a pattern matches the whole value or
/// any class of a well-formed list.
fn user_class_matches(patterns: &[Pattern], data: &[u8]) -> bool {
    if patterns.iter().any(|p| p.matches(data)) {
        return true;
    }
    let mut rest = data;
    let mut parts = 0;
    while let [len, tail @ ..] = rest {
        let len = usize::from(*len);
        if len == 0 || tail.len() < len {
            return false; // not an RFC 3004 list
        }
        parts += 1;
        rest = &tail[len..];
    }
    if parts == 0 {
        return false;
    }
    let mut rest = data;
    while let [len, tail @ ..] = rest {
        let (one, next) = tail.split_at(usize::from(*len));
        if patterns.iter().any(|p| p.matches(one)) {
            return true;
        }
        rest = next;
    }
    false
}

/// Sub-option `code` of an option 82 TLV (RFC 3046 §2.0), if present and well formed.
pub fn relay_sub_option(raw82: &[u8], code: u8) -> Option<&[u8]> {
    let mut rest = raw82.get(2..)?;
    while let [c, len, tail @ ..] = rest {
        let len = usize::from(*len);
        let value = tail.get(..len)?;
        if *c == code {
            return Some(value);
        }
        rest = &tail[len..];
    }
    None
}
