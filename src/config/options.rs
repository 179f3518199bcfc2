//! DHCP options in the configuration: the table of options twinlease knows by name, typed
//! values, vendor sub-options (option 43, RFC 2132 §8.4) and vendor-identifying blocks (option
//! 125, RFC 3925). Every value is checked and encoded once, when the file loads; a reply only
//! copies the bytes made here.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::Range;

use ipnet::Ipv4Net;
use toml::Spanned;

use super::ConfigError;
use super::validate::Source;
use super::wire;

/// How an option's value is written in the file and encoded on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OptionType {
    /// One IPv4 address.
    Ip,
    /// One or more IPv4 addresses.
    IpList,
    U8,
    U16,
    U32,
    I32,
    /// One byte, 0 or 1.
    Bool,
    /// Text (UTF-8, no NUL), at least one byte.
    Text,
    /// Raw bytes written as hex ("01:02:0a" or "01020a").
    Hex,
    /// Classless static routes (RFC 3442): "198.18.40.0/24 via 198.18.0.1".
    Routes,
    /// Domain names in DNS wire format (RFC 3397), uncompressed.
    DomainList,
    U8List,
    U16List,
    /// Option 43: sub-options (`sub`) or raw bytes (`value`, hex).
    Encapsulated,
    /// Option 125: one block per `enterprise`, sub-options or raw bytes.
    VendorIdentifying,
}

impl OptionType {
    pub fn name(self) -> &'static str {
        match self {
            OptionType::Ip => "ip",
            OptionType::IpList => "ip-list",
            OptionType::U8 => "u8",
            OptionType::U16 => "u16",
            OptionType::U32 => "u32",
            OptionType::I32 => "i32",
            OptionType::Bool => "bool",
            OptionType::Text => "string",
            OptionType::Hex => "hex",
            OptionType::Routes => "routes",
            OptionType::DomainList => "domain-list",
            OptionType::U8List => "u8-list",
            OptionType::U16List => "u16-list",
            OptionType::Encapsulated => "encapsulated",
            OptionType::VendorIdentifying => "vendor-identifying",
        }
    }

    /// The types a user may write as `type = ...` (the two vendor containers are fixed to
    /// their codes).
    const WRITABLE: [OptionType; 13] = [
        OptionType::Ip,
        OptionType::IpList,
        OptionType::U8,
        OptionType::U16,
        OptionType::U32,
        OptionType::I32,
        OptionType::Bool,
        OptionType::Text,
        OptionType::Hex,
        OptionType::Routes,
        OptionType::DomainList,
        OptionType::U8List,
        OptionType::U16List,
    ];

    fn parse(text: &str) -> Option<OptionType> {
        OptionType::WRITABLE.into_iter().find(|t| t.name() == text)
    }

    /// Types whose RFC tells servers to split long values per RFC 3396 (RFC 3442 §2, RFC 3397
    /// §2, RFC 3925 §4, and option 43 by its carrier); every other option stays within the 255
    /// bytes RFC 2132 gives it, since clients without RFC 3396 would read only the first part.
    fn may_be_long(self) -> bool {
        matches!(
            self,
            OptionType::Routes | OptionType::DomainList | OptionType::Encapsulated | OptionType::VendorIdentifying
        )
    }

    fn list_hint(self) -> &'static str {
        match self {
            OptionType::Ip => "write one address, e.g. \"198.18.0.1\"",
            OptionType::IpList => "write addresses, e.g. [\"198.18.0.1\", \"198.18.0.2\"]",
            OptionType::U8 => "write an integer from 0 to 255",
            OptionType::U16 => "write an integer from 0 to 65535",
            OptionType::U32 => "write an integer from 0 to 4294967295",
            OptionType::I32 => "write an integer from -2147483648 to 2147483647",
            OptionType::Bool => "write true or false",
            OptionType::Text => "write a non-empty string without NUL characters",
            OptionType::Hex => "write hex bytes, e.g. \"01:02:0a\" or \"01020a\"",
            OptionType::Routes => "write routes as [\"198.18.40.0/24 via 198.18.0.1\", \"0.0.0.0/0 via 198.18.0.1\"]",
            OptionType::DomainList => "write domain names, e.g. [\"branch.example\", \"example\"]",
            OptionType::U8List => "write integers from 0 to 255, e.g. [1, 2]",
            OptionType::U16List => "write integers from 0 to 65535, e.g. [576, 1500]",
            OptionType::Encapsulated => {
                "give sub-options as sub = [{ code = 1, type = \"ip\", value = \"198.18.0.5\" }]"
            }
            OptionType::VendorIdentifying => {
                "give enterprise = NUMBER and sub = [{ code = 1, type = \"string\", value = \"...\" }]"
            }
        }
    }
}

/// An option twinlease knows by name.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    pub code: u8,
    pub name: &'static str,
    pub ty: OptionType,
}

const fn known(code: u8, name: &'static str, ty: OptionType) -> Known {
    Known { code, name, ty }
}

/// Options known by name (RFC 2132 and later). Any other code can be sent with `code` and
/// `type`, or named once with `[[option_def]]`.
pub const KNOWN: &[Known] = &[
    known(2, "time-offset", OptionType::I32),
    known(3, "routers", OptionType::IpList),
    known(4, "time-servers", OptionType::IpList),
    known(6, "domain-name-servers", OptionType::IpList),
    known(7, "log-servers", OptionType::IpList),
    known(12, "host-name", OptionType::Text),
    known(15, "domain-name", OptionType::Text),
    known(19, "ip-forwarding", OptionType::Bool),
    known(23, "default-ip-ttl", OptionType::U8),
    known(26, "interface-mtu", OptionType::U16),
    known(31, "router-discovery", OptionType::Bool),
    known(35, "arp-cache-timeout", OptionType::U32),
    known(42, "ntp-servers", OptionType::IpList),
    known(43, "vendor-encapsulated-options", OptionType::Encapsulated),
    known(44, "netbios-name-servers", OptionType::IpList),
    known(46, "netbios-node-type", OptionType::U8),
    known(47, "netbios-scope", OptionType::Text),
    known(60, "vendor-class-identifier", OptionType::Text),
    known(66, "tftp-server-name", OptionType::Text),
    known(67, "boot-file-name", OptionType::Text),
    known(69, "smtp-servers", OptionType::IpList),
    known(72, "www-servers", OptionType::IpList),
    known(100, "posix-timezone", OptionType::Text),
    known(101, "tzdb-timezone", OptionType::Text),
    known(108, "ipv6-only-preferred", OptionType::U32),
    known(114, "captive-portal", OptionType::Text),
    known(119, "domain-search", OptionType::DomainList),
    known(121, "classless-static-routes", OptionType::Routes),
    known(125, "vendor-identifying", OptionType::VendorIdentifying),
    known(138, "capwap-ac-addresses", OptionType::IpList),
    known(150, "tftp-server-address", OptionType::IpList),
    known(249, "ms-classless-static-routes", OptionType::Routes),
    known(252, "wpad-url", OptionType::Text),
];

/// Codes the server fills in itself (or that only clients and relays send): configuring them
/// would contradict what the protocol code writes.
fn managed(code: u8) -> Option<&'static str> {
    Some(match code {
        0 | 255 => "pad and end are not options",
        1 => "the subnet mask comes from the subnet's cidr",
        28 => "the broadcast address comes from the subnet's cidr",
        50 | 55 | 57 | 61 | 81 | 118 => "only clients send this option",
        51 | 58 | 59 => "lease times come from lease_secs, renew_secs and rebind_secs",
        52 => "option overload is used by the server when a reply needs the room",
        53 | 54 | 56 => "the server writes the message type, its identifier and messages itself",
        82 => "relay agent information is echoed from the request",
        _ => return None,
    })
}

/// The BOOTP header fields that are set like options (most specific level wins) but travel in
/// the fixed header: siaddr, file and sname.
const HEADER_FIELDS: [(&str, &str); 3] = [
    ("next-server", "the TFTP server's address, sent in siaddr"),
    ("boot-file", "the boot file name, sent in the file field (at most 127 bytes)"),
    ("server-name", "the boot server's name, sent in the sname field (at most 63 bytes)"),
];

/// One option value ready to go on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionValue {
    pub code: u8,
    /// For option 125: this block's enterprise number; the reply joins every block.
    pub enterprise: Option<u32>,
    /// The option's data (without code and length); may exceed 255 bytes for the types that
    /// RFC 3396 splitting is meant for.
    pub data: Box<[u8]>,
    /// Sent even when the client did not ask for it.
    pub always_send: bool,
}

/// The options set at one level (global, subnet, pool, class or reservation), sorted by code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OptionSet {
    options: Vec<OptionValue>,
    pub next_server: Option<Ipv4Addr>,
    pub boot_file: Option<Box<str>>,
    pub server_name: Option<Box<str>>,
}

impl OptionSet {
    /// The value for `code` at this level (for 125, the first block).
    pub fn get(&self, code: u8) -> Option<&OptionValue> {
        let i = self.options.partition_point(|o| o.code < code);
        self.options.get(i).filter(|o| o.code == code)
    }

    /// Every block of option 125 at this level, by enterprise number.
    pub fn vendor_blocks(&self) -> &[OptionValue] {
        let start = self.options.partition_point(|o| o.code < 125);
        let end = self.options.partition_point(|o| o.code <= 125);
        &self.options[start..end]
    }

    pub fn iter(&self) -> impl Iterator<Item = &OptionValue> {
        self.options.iter()
    }

    pub fn is_empty(&self) -> bool {
        self.options.is_empty() && self.next_server.is_none() && self.boot_file.is_none() && self.server_name.is_none()
    }

    /// Adds a value computed by the server (subnet mask, broadcast address) or written with a
    /// subnet's own keys (routers, dns_servers, domain_name, ntp_servers).
    pub(super) fn insert(&mut self, code: u8, data: Vec<u8>) {
        let i = self.options.partition_point(|o| o.code < code);
        self.options.insert(i, OptionValue { code, enterprise: None, data: data.into(), always_send: false });
    }

    fn push(&mut self, v: OptionValue) {
        let key = (v.code, v.enterprise);
        let i = self.options.partition_point(|o| (o.code, o.enterprise) < key);
        self.options.insert(i, v);
    }
}

/// Bytes an option of `data_len` bytes takes on the wire, split into parts of at most 255
/// bytes (RFC 3396) with a code and length byte each.
pub fn encoded_len(data_len: usize) -> usize {
    data_len + 2 * data_len.div_ceil(255).max(1)
}

/// The largest DHCP message twinlease sends (Ethernet MTU less IPv4 and UDP headers).
const LARGEST_REPLY: usize = 1472;

/// What every ACK carries besides configured options: message type (3), server identifier
/// (6), three lease times (18), subnet mask (6) and End (1).
const FIXED_REPLY_OPTIONS: usize = 3 + 6 + 18 + 6 + 1;

/// The most bytes one option may take: the options field of the largest reply, less what
/// every ACK carries anyway.
pub const MAX_OPTION_BYTES: usize = LARGEST_REPLY - 240 - FIXED_REPLY_OPTIONS;

/// Option definitions: the built-in table plus `[[option_def]]`, and the types given inline
/// to codes with no definition (all uses of one code must agree).
pub(super) struct Defs {
    by_name: HashMap<String, (u8, OptionType)>,
    by_code: HashMap<u8, (String, OptionType)>,
    inline: HashMap<u8, (OptionType, Range<usize>)>,
}

impl Defs {
    pub(super) fn new(src: &Source, list: &[Spanned<wire::OptionDefSection>]) -> Result<Defs, ConfigError> {
        let mut d = Defs { by_name: HashMap::new(), by_code: HashMap::new(), inline: HashMap::new() };
        for k in KNOWN {
            d.by_name.insert(k.name.to_string(), (k.code, k.ty));
            d.by_code.insert(k.code, (k.name.to_string(), k.ty));
        }
        for def in list {
            let w = def.get_ref();
            let name = w.name.get_ref();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(src.err(
                    w.name.span(),
                    format!("option name {name:?} is not a valid name"),
                    "use letters, digits, '-' and '_'",
                ));
            }
            let code = code_value(src, &w.code)?;
            if let Some(why) = managed(code) {
                return Err(src.err(w.code.span(), format!("option {code} cannot be configured: {why}"), MANAGED_HINT));
            }
            if let Some((other, _)) = d.by_code.get(&code) {
                return Err(src.err(
                    w.code.span(),
                    format!("option {code} is already defined as {other}"),
                    format!("use name = \"{other}\" where you set it, or define another code"),
                ));
            }
            if d.by_name.contains_key(name) || HEADER_FIELDS.iter().any(|(n, _)| n == name) {
                return Err(src.err(
                    w.name.span(),
                    format!("option name {name} is already taken"),
                    "choose a name that is not built in (see README \"Options and classes\") or defined above",
                ));
            }
            let ty = type_value(src, &w.kind)?;
            d.by_name.insert(name.clone(), (code, ty));
            d.by_code.insert(code, (name.clone(), ty));
        }
        Ok(d)
    }

    /// The code `name` stands for.
    pub(super) fn code_of(&self, name: &str) -> Option<u8> {
        self.by_name.get(name).map(|(c, _)| *c)
    }
}

const MANAGED_HINT: &str = "remove this option; see README \"Options and classes\" for what twinlease sets itself";

fn code_value(src: &Source, v: &Spanned<i64>) -> Result<u8, ConfigError> {
    u8::try_from(*v.get_ref())
        .ok()
        .filter(|c| (1..=254).contains(c))
        .ok_or_else(|| src.err(v.span(), format!("option code {} is out of range", v.get_ref()), "use 1 to 254"))
}

fn type_value(src: &Source, v: &Spanned<String>) -> Result<OptionType, ConfigError> {
    OptionType::parse(v.get_ref()).ok_or_else(|| {
        let names: Vec<&str> = OptionType::WRITABLE.iter().map(|t| t.name()).collect();
        src.err(
            v.span(),
            format!("{:?} is not an option type", v.get_ref()),
            format!("use one of {}", names.join(", ")),
        )
    })
}

/// Validates the `[[option]]` list of one level and encodes every value.
pub(super) fn option_set(
    src: &Source,
    defs: &mut Defs,
    list: &[Spanned<wire::OptionSection>],
) -> Result<OptionSet, ConfigError> {
    let mut set = OptionSet::default();
    let mut seen: HashMap<(u8, Option<u32>), Range<usize>> = HashMap::new();
    for entry in list {
        let w = entry.get_ref();
        let whole = entry.span();
        if let Some(name) = &w.name
            && let Some(field) = HEADER_FIELDS.iter().position(|(n, _)| n == name.get_ref())
        {
            header_field(src, &mut set, field, w, &whole)?;
            continue;
        }
        let (code, ty, code_span) = resolve(src, defs, w, &whole)?;
        let enterprise = enterprise(src, w, ty, &code_span)?;
        if let Some(earlier) = seen.insert((code, enterprise), code_span.clone()) {
            let line = src.position(earlier.start).1;
            return Err(src.err(
                code_span,
                format!("option {code} is set twice at this level (first on line {line})"),
                "set each option once per level; the most specific level wins over the others",
            ));
        }
        let data = match ty {
            OptionType::Encapsulated | OptionType::VendorIdentifying => container(src, w, ty, &code_span)?,
            _ => {
                if !w.sub.is_empty() {
                    return Err(src.err(
                        w.sub[0].span(),
                        format!("option {code} ({}) has no sub-options", ty.name()),
                        "sub-options belong to option 43 (vendor-encapsulated-options) or 125",
                    ));
                }
                let value = w
                    .value
                    .as_ref()
                    .ok_or_else(|| src.err(code_span.clone(), format!("option {code} has no value"), ty.list_hint()))?;
                encode_value(src, ty, value)?
            }
        };
        let limit = if ty == OptionType::VendorIdentifying || !ty.may_be_long() { 255 } else { usize::MAX };
        let at = w.value.as_ref().map_or(code_span.clone(), |v| v.span());
        if data.len() > limit {
            return Err(src.err(
                at,
                format!(
                    "option {code} is {} bytes long; an option of type {} holds at most 255",
                    data.len(),
                    ty.name()
                ),
                "shorten the value (RFC 2132 options carry at most 255 bytes)",
            ));
        }
        if encoded_len(data.len()) > MAX_OPTION_BYTES {
            return Err(src.err(
                at,
                format!(
                    "option {code} needs {} bytes on the wire; at most {MAX_OPTION_BYTES} fit in the largest reply \
                     ({LARGEST_REPLY} bytes) next to the options every reply carries",
                    encoded_len(data.len())
                ),
                "shorten the value or split it over several options",
            ));
        }
        set.push(OptionValue { code, enterprise, data: data.into(), always_send: w.always_send });
    }
    Ok(set)
}

/// Option 125's enterprise number: required there, refused anywhere else.
fn enterprise(
    src: &Source,
    w: &wire::OptionSection,
    ty: OptionType,
    code_span: &Range<usize>,
) -> Result<Option<u32>, ConfigError> {
    match (&w.enterprise, ty) {
        (Some(e), OptionType::VendorIdentifying) => u32::try_from(*e.get_ref())
            .map(Some)
            .map_err(|_| src.err(e.span(), "enterprise number out of range", "use 0 to 4294967295")),
        (None, OptionType::VendorIdentifying) => Err(src.err(
            code_span.clone(),
            "option 125 needs the enterprise number its sub-options belong to",
            "add enterprise = NUMBER (IANA private enterprise number, e.g. 3561)",
        )),
        (Some(e), _) => Err(src.err(e.span(), "enterprise is only for option 125", "remove enterprise")),
        (None, _) => Ok(None),
    }
}

/// The code and type an entry stands for, and where to point at it.
fn resolve(
    src: &Source,
    defs: &mut Defs,
    w: &wire::OptionSection,
    whole: &Range<usize>,
) -> Result<(u8, OptionType, Range<usize>), ConfigError> {
    let (code, defined, span) = match (&w.name, &w.code) {
        (Some(name), code) => {
            let Some(&(c, ty)) = defs.by_name.get(name.get_ref()) else {
                return Err(src.err(
                    name.span(),
                    format!("no option is named {:?}", name.get_ref()),
                    "use a name from README \"Options and classes\", define it with [[option_def]], or give code and type",
                ));
            };
            if let Some(code) = code
                && i64::from(c) != *code.get_ref()
            {
                return Err(src.err(
                    code.span(),
                    format!("option {} has code {c}, not {}", name.get_ref(), code.get_ref()),
                    "remove code (the name says it) or fix it",
                ));
            }
            (c, Some(ty), name.span())
        }
        (None, Some(code)) => {
            let c = code_value(src, code)?;
            (c, defs.by_code.get(&c).map(|(_, t)| *t), code.span())
        }
        (None, None) => {
            return Err(src.err(
                whole.clone(),
                "an [[option]] needs a name or a code",
                "add name = \"...\" or code = N",
            ));
        }
    };
    if let Some(why) = managed(code) {
        return Err(src.err(span, format!("option {code} cannot be configured: {why}"), MANAGED_HINT));
    }
    let ty = match (defined, &w.kind) {
        (Some(ty), None) => ty,
        (Some(ty), Some(k)) => {
            let given = type_value(src, k)?;
            if given != ty {
                return Err(src.err(
                    k.span(),
                    format!("option {code} has type {}, not {}", ty.name(), given.name()),
                    "remove type (the definition gives it) or fix it",
                ));
            }
            ty
        }
        (None, Some(k)) => {
            let ty = type_value(src, k)?;
            if let Some((other, at)) = defs.inline.get(&code)
                && *other != ty
            {
                let line = src.position(at.start).1;
                return Err(src.err(
                    k.span(),
                    format!("option {code} is given type {} here but {} on line {line}", ty.name(), other.name()),
                    "give an option the same type everywhere (or name it once with [[option_def]])",
                ));
            }
            defs.inline.entry(code).or_insert((ty, k.span()));
            ty
        }
        (None, None) => {
            return Err(src.err(
                span,
                format!("option {code} has no built-in type"),
                "add type = \"...\" (ip, ip-list, u8, u16, u32, i32, bool, string, hex, routes, domain-list, u8-list, u16-list)",
            ));
        }
    };
    Ok((code, ty, span))
}

fn header_field(
    src: &Source,
    set: &mut OptionSet,
    field: usize,
    w: &wire::OptionSection,
    whole: &Range<usize>,
) -> Result<(), ConfigError> {
    let (name, what) = HEADER_FIELDS[field];
    if let Some(extra) = w.code.as_ref().map(|c| c.span()).or(w.kind.as_ref().map(|k| k.span())) {
        return Err(src.err(extra, format!("{name} is a header field: {what}"), "remove code and type"));
    }
    let Some(value) = &w.value else {
        return Err(src.err(whole.clone(), format!("{name} has no value"), format!("give the value: {what}")));
    };
    let taken = match field {
        0 => set.next_server.is_some(),
        1 => set.boot_file.is_some(),
        _ => set.server_name.is_some(),
    };
    if taken {
        return Err(src.err(value.span(), format!("{name} is set twice at this level"), "set it once per level"));
    }
    if field == 0 {
        set.next_server = Some(ip_of(src, value.span(), value.get_ref(), OptionType::Ip)?);
        return Ok(());
    }
    let max = if field == 1 { 127 } else { 63 };
    let text = value.get_ref().as_str().filter(|t| !t.is_empty() && t.len() <= max && !t.contains('\0'));
    let Some(text) = text else {
        return Err(src.err(
            value.span(),
            format!("{name} must be a string of 1 to {max} bytes"),
            format!("give {what}; a longer name can go in an option instead"),
        ));
    };
    if field == 1 {
        set.boot_file = Some(text.into());
    } else {
        set.server_name = Some(text.into());
    }
    Ok(())
}

/// Option 43 or 125: either sub-options or raw bytes.
fn container(
    src: &Source,
    w: &wire::OptionSection,
    ty: OptionType,
    code_span: &Range<usize>,
) -> Result<Vec<u8>, ConfigError> {
    match (&w.value, w.sub.is_empty()) {
        (Some(v), true) => encode_value(src, OptionType::Hex, v),
        (None, false) => {
            let mut out = Vec::new();
            let mut codes: HashMap<u8, Range<usize>> = HashMap::new();
            for s in &w.sub {
                let sw = s.get_ref();
                let code =
                    u8::try_from(*sw.code.get_ref()).ok().filter(|c| (1..=254).contains(c)).ok_or_else(|| {
                        src.err(
                            sw.code.span(),
                            format!("sub-option code {} is out of range", sw.code.get_ref()),
                            "use 1 to 254",
                        )
                    })?;
                if let Some(earlier) = codes.insert(code, sw.code.span()) {
                    let line = src.position(earlier.start).1;
                    return Err(src.err(
                        sw.code.span(),
                        format!("sub-option {code} is set twice (first on line {line})"),
                        "set each sub-option once",
                    ));
                }
                let sty = type_value(src, &sw.kind)?;
                let data = encode_value(src, sty, &sw.value)?;
                if data.len() > 255 {
                    return Err(src.err(
                        sw.value.span(),
                        format!("sub-option {code} is {} bytes long; a sub-option holds at most 255", data.len()),
                        "shorten the value",
                    ));
                }
                out.push(code);
                out.push(data.len() as u8);
                out.extend_from_slice(&data);
            }
            Ok(out)
        }
        (Some(v), false) => {
            Err(src.err(v.span(), "give either value (raw hex) or sub-options, not both", ty.list_hint()))
        }
        (None, true) => {
            Err(src.err(code_span.clone(), "this option has neither value nor sub-options", ty.list_hint()))
        }
    }
}

/// Where `needle` (an element of a list value) is written inside `span`, so an error points at
/// the element; the whole value if it cannot be found.
fn element_span(src: &Source, span: &Range<usize>, needle: &str) -> Range<usize> {
    let text = src.text.get(span.clone()).unwrap_or("");
    match text.find(needle) {
        Some(i) if !needle.is_empty() => {
            // From the opening quote of a string, as an editor would show it.
            let quoted = i > 0 && matches!(text.as_bytes()[i - 1], b'"' | b'\'');
            let start = span.start + i - usize::from(quoted);
            start..span.start + i + needle.len()
        }
        _ => span.clone(),
    }
}

fn bad(src: &Source, span: Range<usize>, ty: OptionType, what: String) -> ConfigError {
    src.err(span, what, ty.list_hint())
}

fn ip_of(src: &Source, span: Range<usize>, v: &toml::Value, ty: OptionType) -> Result<Ipv4Addr, ConfigError> {
    let text = v.as_str().ok_or_else(|| bad(src, span.clone(), ty, format!("{v} is not an address")))?;
    text.trim().parse().map_err(|_| {
        let at = element_span(src, &span, text);
        bad(src, at, ty, format!("{text:?} is not an IPv4 address"))
    })
}

/// A list value's elements; a single value counts as a list of one.
fn elements(v: &toml::Value) -> Vec<&toml::Value> {
    match v {
        toml::Value::Array(a) => a.iter().collect(),
        other => vec![other],
    }
}

fn integer(
    src: &Source,
    span: &Range<usize>,
    ty: OptionType,
    v: &toml::Value,
    lo: i64,
    hi: i64,
) -> Result<i64, ConfigError> {
    match v.as_integer() {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        Some(n) => Err(bad(src, element_span(src, span, &n.to_string()), ty, format!("{n} is out of range"))),
        None => Err(bad(src, span.clone(), ty, format!("{v} is not an integer"))),
    }
}

/// Checks a value against its type and returns its wire encoding.
pub(super) fn encode_value(src: &Source, ty: OptionType, value: &Spanned<toml::Value>) -> Result<Vec<u8>, ConfigError> {
    let span = value.span();
    let v = value.get_ref();
    let mut out = Vec::new();
    match ty {
        OptionType::Ip => out.extend_from_slice(&ip_of(src, span, v, ty)?.octets()),
        OptionType::IpList => {
            let list = elements(v);
            if list.is_empty() {
                return Err(bad(src, span, ty, "the list is empty".into()));
            }
            for e in list {
                out.extend_from_slice(&ip_of(src, span.clone(), e, ty)?.octets());
            }
        }
        OptionType::U8 => out.push(integer(src, &span, ty, v, 0, 255)? as u8),
        OptionType::U16 => out.extend_from_slice(&(integer(src, &span, ty, v, 0, 65535)? as u16).to_be_bytes()),
        OptionType::U32 => {
            out.extend_from_slice(&(integer(src, &span, ty, v, 0, u32::MAX.into())? as u32).to_be_bytes())
        }
        OptionType::I32 => {
            out.extend_from_slice(&(integer(src, &span, ty, v, i32::MIN.into(), i32::MAX.into())? as i32).to_be_bytes())
        }
        OptionType::Bool => match v.as_bool() {
            Some(b) => out.push(u8::from(b)),
            None => return Err(bad(src, span, ty, format!("{v} is not true or false"))),
        },
        OptionType::Text => match v.as_str() {
            Some(t) if !t.is_empty() && !t.contains('\0') => out.extend_from_slice(t.as_bytes()),
            _ => return Err(bad(src, span, ty, format!("{v} is not a non-empty string"))),
        },
        OptionType::Hex => {
            let text = v.as_str().ok_or_else(|| bad(src, span.clone(), ty, format!("{v} is not a hex string")))?;
            out = parse_hex(text).ok_or_else(|| bad(src, span.clone(), ty, format!("{text:?} is not hex bytes")))?;
        }
        OptionType::Routes => {
            let list = elements(v);
            if list.is_empty() {
                return Err(bad(src, span, ty, "the list is empty".into()));
            }
            for e in list {
                let text = e.as_str().ok_or_else(|| bad(src, span.clone(), ty, format!("{e} is not a route")))?;
                let (net, router) = parse_route(text)
                    .map_err(|why| bad(src, element_span(src, &span, text), ty, format!("route {text:?} {why}")))?;
                encode_route(net, router, &mut out);
            }
        }
        OptionType::DomainList => {
            let list = elements(v);
            if list.is_empty() {
                return Err(bad(src, span, ty, "the list is empty".into()));
            }
            for e in list {
                let text = e.as_str().ok_or_else(|| bad(src, span.clone(), ty, format!("{e} is not a domain name")))?;
                encode_domain(text, &mut out).ok_or_else(|| {
                    bad(src, element_span(src, &span, text), ty, format!("{text:?} is not a valid domain name"))
                })?;
            }
        }
        OptionType::U8List | OptionType::U16List => {
            let list = elements(v);
            if list.is_empty() {
                return Err(bad(src, span, ty, "the list is empty".into()));
            }
            for e in list {
                if ty == OptionType::U8List {
                    out.push(integer(src, &span, ty, e, 0, 255)? as u8);
                } else {
                    out.extend_from_slice(&(integer(src, &span, ty, e, 0, 65535)? as u16).to_be_bytes());
                }
            }
        }
        OptionType::Encapsulated | OptionType::VendorIdentifying => {
            return Err(bad(src, span, ty, "sub-options cannot be nested".into()));
        }
    }
    Ok(out)
}

/// "01:02:0a", "01-02-0a", "01020a" or "0x01020a"; "" is no bytes.
pub(super) fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    let digits: String = if t.contains([':', '-']) {
        let parts: Vec<&str> = t.split([':', '-']).collect();
        if parts.iter().any(|p| p.len() != 2) {
            return None;
        }
        parts.concat()
    } else {
        t.to_string()
    };
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    (0..digits.len()).step_by(2).map(|i| u8::from_str_radix(digits.get(i..i + 2)?, 16).ok()).collect()
}

/// "198.18.40.0/24 via 198.18.0.1" (or "default via ...").
fn parse_route(text: &str) -> Result<(Ipv4Net, Ipv4Addr), &'static str> {
    let (dest, router) = text.split_once(" via ").ok_or("is not written as \"NETWORK/LEN via ROUTER\"")?;
    let dest = dest.trim();
    let net: Ipv4Net = if dest == "default" {
        Ipv4Net::default()
    } else {
        dest.parse().map_err(|_| "has no valid destination network (NETWORK/LEN)")?
    };
    if net.trunc() != net {
        return Err("has host bits set in its destination");
    }
    let router: Ipv4Addr = router.trim().parse().map_err(|_| "has no valid router address")?;
    Ok((net, router))
}

/// RFC 3442 §2: prefix length, the significant octets of the destination, then the router.
fn encode_route(net: Ipv4Net, router: Ipv4Addr, out: &mut Vec<u8>) {
    let len = net.prefix_len();
    out.push(len);
    out.extend_from_slice(&net.network().octets()[..usize::from(len).div_ceil(8)]);
    out.extend_from_slice(&router.octets());
}

/// RFC 1035 §3.1 labels; None for a name that is not a valid host name.
fn encode_domain(name: &str, out: &mut Vec<u8>) -> Option<()> {
    let name = name.trim().trim_end_matches('.');
    if name.is_empty() || name.len() > 253 {
        return None;
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return None;
        }
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    Some(())
}
