//! Client classes: which clients a `[[class]]` takes in (vendor class, user class, hardware
//! address prefix, relay agent circuit/remote id, interface, relay), compiled when the file
//! loads into byte patterns and indexes, so a request is classified by comparing bytes.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use toml::Spanned;

use super::options::{Defs, OptionSet, option_set, parse_hex};
use super::validate::Source;
use super::{ConfigError, wire};

/// At most this many classes: a request's classes are one 64-bit set.
pub const MAX_CLASSES: usize = 64;

/// A set of classes by index in [`super::Config::classes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ClassSet(pub u64);

impl ClassSet {
    pub const EMPTY: ClassSet = ClassSet(0);

    pub fn with(self, class: usize) -> ClassSet {
        ClassSet(self.0 | (1 << class))
    }
    pub fn contains(self, class: usize) -> bool {
        self.0 & (1 << class) != 0
    }
    pub fn intersects(self, other: ClassSet) -> bool {
        self.0 & other.0 != 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The pool rule: a client in `classes` may use a pool that allows `allow` (none: every
    /// client) and denies `deny`.
    pub fn admits(allow: ClassSet, deny: ClassSet, classes: ClassSet) -> bool {
        (allow.is_empty() || allow.intersects(classes)) && !deny.intersects(classes)
    }
    /// Class indexes in ascending order (the order of the file: the first one wins).
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut rest = self.0;
        std::iter::from_fn(move || {
            if rest == 0 {
                return None;
            }
            let i = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            Some(i)
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternKind {
    Exact,
    /// "text*"
    Prefix,
    /// "*text"
    Suffix,
    /// "*text*"
    Contains,
}

/// A compiled match against bytes a client or relay sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pattern {
    pub bytes: Box<[u8]>,
    pub kind: PatternKind,
}

impl Pattern {
    /// "text", "text*", "*text", "*text*"; with a leading "0x" the text is hex bytes
    /// ("0x0004000a*"). `*` is special only at either end.
    pub fn parse(text: &str) -> Option<Pattern> {
        let (body, starts) = match text.strip_prefix('*') {
            Some(rest) => (rest, true),
            None => (text, false),
        };
        let (body, ends) = match body.strip_suffix('*') {
            Some(rest) => (rest, true),
            None => (body, false),
        };
        let bytes: Vec<u8> = match body.strip_prefix("0x") {
            Some(hex) => parse_hex(hex)?,
            None => body.as_bytes().to_vec(),
        };
        if bytes.is_empty() {
            return None;
        }
        let kind = match (starts, ends) {
            (false, false) => PatternKind::Exact,
            (false, true) => PatternKind::Prefix,
            (true, false) => PatternKind::Suffix,
            (true, true) => PatternKind::Contains,
        };
        Some(Pattern { bytes: bytes.into(), kind })
    }

    pub fn matches(&self, data: &[u8]) -> bool {
        let b = &self.bytes[..];
        match self.kind {
            PatternKind::Exact => data == b,
            PatternKind::Prefix => data.starts_with(b),
            PatternKind::Suffix => data.ends_with(b),
            PatternKind::Contains => data.windows(b.len()).any(|w| w == b),
        }
    }
}

/// A validated `[[class]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    /// Option 60.
    pub vendor_class: Vec<Pattern>,
    /// Option 77: any user class the client names (RFC 3004), or its whole value.
    pub user_class: Vec<Pattern>,
    /// Leading bytes of chaddr (an OUI is three).
    pub hw_prefix: Vec<Box<[u8]>>,
    /// Option 82 sub-option 1 (RFC 3046).
    pub circuit_id: Vec<Pattern>,
    /// Option 82 sub-option 2.
    pub remote_id: Vec<Pattern>,
    /// Indexes into `[dhcp] interfaces`: the request arrived there directly (not relayed).
    pub interfaces: Vec<usize>,
    /// The request was relayed with a giaddr in one of these networks.
    pub relays: Vec<Ipv4Net>,
    pub options: OptionSet,
}

/// Every `[[class]]`, in file order.
pub(super) fn classes(
    src: &Source,
    defs: &mut Defs,
    list: &[Spanned<wire::ClassSection>],
    interfaces: &[String],
) -> Result<Vec<Class>, ConfigError> {
    if let Some(extra) = list.get(MAX_CLASSES) {
        return Err(src.err(
            extra.get_ref().name.span(),
            format!("more than {MAX_CLASSES} classes"),
            "merge classes: one class may list several patterns for each match",
        ));
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let w = c.get_ref();
        let name = w.name.get_ref();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(src.err(
                w.name.span(),
                format!("class name {name:?} is not a valid name"),
                "use letters, digits, '-' and '_'",
            ));
        }
        if let Some(line) = names.insert(name, src.position(w.name.span().start).1) {
            return Err(src.err(
                w.name.span(),
                format!("class {name} is defined twice (first on line {line})"),
                "give each class its own name",
            ));
        }
        out.push(class(src, defs, w, interfaces)?);
    }
    Ok(out)
}

/// One class, its matches compiled.
fn class(src: &Source, defs: &mut Defs, w: &wire::ClassSection, interfaces: &[String]) -> Result<Class, ConfigError> {
    let name = w.name.get_ref();
    let class = Class {
        name: name.clone(),
        vendor_class: patterns(src, &w.vendor_class, "vendor_class")?,
        user_class: patterns(src, &w.user_class, "user_class")?,
        hw_prefix: hw_prefixes(src, &w.hw_prefix)?,
        circuit_id: patterns(src, &w.circuit_id, "circuit_id")?,
        remote_id: patterns(src, &w.remote_id, "remote_id")?,
        interfaces: interface_indexes(src, &w.interface, interfaces)?,
        relays: relay_networks(src, &w.relay)?,
        options: option_set(src, defs, &w.option)?,
    };
    let any = !(class.vendor_class.is_empty()
        && class.user_class.is_empty()
        && class.hw_prefix.is_empty()
        && class.circuit_id.is_empty()
        && class.remote_id.is_empty()
        && class.interfaces.is_empty()
        && class.relays.is_empty());
    if !any {
        return Err(src.err(
            w.name.span(),
            format!("class {name} matches nothing"),
            "add at least one of vendor_class, user_class, hw_prefix, circuit_id, remote_id, interface, relay",
        ));
    }
    Ok(class)
}

fn patterns(src: &Source, list: &[Spanned<String>], what: &str) -> Result<Vec<Pattern>, ConfigError> {
    list.iter()
        .map(|p| {
            Pattern::parse(p.get_ref()).ok_or_else(|| {
                src.err(
                    p.span(),
                    format!("{what} pattern {:?} is empty or not valid hex", p.get_ref()),
                    "write text (\"Cisco*\", \"*phone*\") or hex after 0x (\"0x0004000a*\")",
                )
            })
        })
        .collect()
}

fn hw_prefixes(src: &Source, list: &[Spanned<String>]) -> Result<Vec<Box<[u8]>>, ConfigError> {
    list.iter()
        .map(|h| {
            parse_hex(h.get_ref()).filter(|b| (1..=16).contains(&b.len())).map(Vec::into_boxed_slice).ok_or_else(|| {
                src.err(
                    h.span(),
                    format!("hw_prefix {:?} is not 1 to 16 hex bytes", h.get_ref()),
                    "write the leading bytes of the hardware address, e.g. \"00:1b:54\" (an OUI)",
                )
            })
        })
        .collect()
}

fn interface_indexes(src: &Source, list: &[Spanned<String>], interfaces: &[String]) -> Result<Vec<usize>, ConfigError> {
    list.iter()
        .map(|i| {
            interfaces.iter().position(|n| n == i.get_ref()).ok_or_else(|| {
                src.err(
                    i.span(),
                    format!("interface {} is not in [dhcp] interfaces", i.get_ref()),
                    "list the interface in [dhcp] interfaces, or match relayed clients with relay",
                )
            })
        })
        .collect()
}

fn relay_networks(src: &Source, list: &[Spanned<String>]) -> Result<Vec<Ipv4Net>, ConfigError> {
    list.iter()
        .map(|r| {
            let text = r.get_ref().trim();
            text.parse::<Ipv4Net>()
                .ok()
                .or_else(|| text.parse::<Ipv4Addr>().ok().map(Ipv4Net::from))
                .filter(|n| n.trunc() == *n)
                .ok_or_else(|| {
                    src.err(
                        r.span(),
                        format!("relay {text:?} is not an address or network"),
                        "write the relay's giaddr (198.18.30.1) or a network of them (198.18.30.0/24)",
                    )
                })
        })
        .collect()
}

/// Class names as written for a pool's `allow_classes` / `deny_classes`.
pub(super) fn class_set(src: &Source, classes: &[Class], names: &[Spanned<String>]) -> Result<ClassSet, ConfigError> {
    let mut set = ClassSet::EMPTY;
    for n in names {
        let i = classes.iter().position(|c| &c.name == n.get_ref()).ok_or_else(|| {
            src.err(n.span(), format!("no class is named {:?}", n.get_ref()), "define it with [[class]] first")
        })?;
        set = set.with(i);
    }
    Ok(set)
}
