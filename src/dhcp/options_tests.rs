//! Options in replies: encoding (RFC 2132 limits, RFC 3396 splitting, option overload, the
//! client's order and size limit), class matching, precedence between levels, class-selected
//! pools and shared networks. Replies are read back with a decoder written here from the RFCs,
//! independent of the encoder.

use std::net::Ipv4Addr;
use std::path::Path;

use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode, UnknownOption};
use dhcproto::{Decodable, Encodable, Encoder};
use proptest::prelude::*;

use super::classify::{Facts, classify, relay_sub_option};
use super::encode::{self, pack};
use super::*;
use crate::allocator::Allocator;
use crate::config::{ClassSet, Config, LocalAddrs, Pattern, PatternKind};

// ---- a reference reader of reply options ------------------------------------------------------

/// The options of a reply as a client reads them: the options field, then `file` and `sname`
/// if option 52 says so (RFC 2131 §4.1), each part of a split option joined in that order
/// (RFC 3396 §5). Returns (code, data) in order of first appearance, and every TLV length.
fn read_options(msg: &[u8]) -> (Vec<(u8, Vec<u8>)>, Vec<usize>) {
    fn walk(area: &[u8], out: &mut Vec<(u8, Vec<u8>)>, lens: &mut Vec<usize>) {
        let mut i = 0;
        while i < area.len() {
            match area[i] {
                0 => i += 1,
                255 => return,
                code => {
                    let len = usize::from(area[i + 1]);
                    let data = &area[i + 2..i + 2 + len];
                    lens.push(len);
                    match out.iter_mut().find(|(c, _)| *c == code) {
                        Some((_, d)) => d.extend_from_slice(data),
                        None => out.push((code, data.to_vec())),
                    }
                    i += 2 + len;
                }
            }
        }
    }
    assert_eq!(msg[236..240], [99, 130, 83, 99], "magic cookie");
    let (mut out, mut lens) = (Vec::new(), Vec::new());
    walk(&msg[240..], &mut out, &mut lens);
    let overload = out.iter().find(|(c, _)| *c == 52).map_or(0, |(_, d)| d[0]);
    if overload & 1 != 0 {
        walk(&msg[108..236], &mut out, &mut lens);
    }
    if overload & 2 != 0 {
        walk(&msg[44..108], &mut out, &mut lens);
    }
    (out, lens)
}

fn option(opts: &[(u8, Vec<u8>)], code: u8) -> Option<&[u8]> {
    opts.iter().find(|(c, _)| *c == code).map(|(_, d)| d.as_slice())
}

// ---- the packer -------------------------------------------------------------------------------

proptest! {
    /// Whatever the items and the room: every placed item reads back exactly (split parts
    /// joined), no TLV is longer than 255, the options field stays within its room, and an
    /// item is left out only if it could not fit when its turn came.
    #[test]
    fn packed_options_read_back_exactly(
        sizes in proptest::collection::vec(0usize..700, 0..14),
        room in 0usize..1300,
        file_free in any::<bool>(),
        sname_free in any::<bool>(),
    ) {
        let datas: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, n)| (0..*n).map(|j| (i * 7 + j) as u8).collect()).collect();
        // Distinct codes that are neither pad, end nor overload.
        let items: Vec<(u8, &[u8])> = datas.iter().enumerate().map(|(i, d)| (100 + i as u8, d.as_slice())).collect();
        let p = pack(&items, room, file_free, sname_free);
        let overloaded = p.file.is_some() || p.sname.is_some();
        prop_assert!(p.main.len() <= room, "{} bytes in a room of {room}", p.main.len());
        prop_assert!(file_free || p.file.is_none());
        prop_assert!(sname_free || p.sname.is_none());
        // A reply with these areas, read as a client would.
        let mut msg = vec![0u8; 240];
        msg[236..240].copy_from_slice(&[99, 130, 83, 99]);
        if let Some(s) = &p.sname { msg[44..108].copy_from_slice(s); }
        if let Some(f) = &p.file { msg[108..236].copy_from_slice(f); }
        msg.extend_from_slice(&p.main);
        msg.push(255);
        let (opts, lens) = read_options(&msg);
        prop_assert!(lens.iter().all(|l| *l <= 255));
        for (i, (code, data)) in items.iter().enumerate() {
            let got = option(&opts, *code);
            if p.placed[i] {
                prop_assert_eq!(got, Some(*data));
            } else {
                prop_assert_eq!(got, None);
            }
        }
        if !overloaded {
            prop_assert!(option(&opts, 52).is_none());
            // Greedy in the client's order: a left-out item did not fit beside the ones before it.
            let mut used = 0;
            for (i, (_, data)) in items.iter().enumerate() {
                let need = crate::config::encoded_len(data.len());
                if p.placed[i] { used += need; } else { prop_assert!(used + need > room, "item {i} fit but was left out"); }
            }
        } else {
            // Overload is used only when it gets more in without losing anything.
            let plain = pack(&items, room, false, false);
            prop_assert!(plain.placed.iter().zip(&p.placed).all(|(a, b)| !a || *b));
            prop_assert!(p.placed.iter().filter(|x| **x).count() > plain.placed.iter().filter(|x| **x).count());
        }
    }
}

#[test]
fn a_long_option_is_split_into_parts_of_255_in_order() {
    let data: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
    let mut out = Vec::new();
    encode::put(&mut out, 121, &data);
    assert_eq!(out.len(), 600 + 3 * 2);
    assert_eq!((out[0], out[1]), (121, 255));
    assert_eq!((out[257], out[258]), (121, 255));
    assert_eq!((out[514], out[515]), (121, 90));
    let mut msg = vec![0u8; 240];
    msg[236..240].copy_from_slice(&[99, 130, 83, 99]);
    msg.extend_from_slice(&out);
    msg.push(255);
    assert_eq!(option(&read_options(&msg).0, 121), Some(&data[..]));
}

#[test]
fn parts_of_a_split_option_continue_in_file_then_sname() {
    // 300 bytes: no room for it in the options field alone, so it starts there and continues.
    let data: Vec<u8> = (0..300u32).map(|i| (i * 3) as u8).collect();
    let p = pack(&[(43, &data)], 270, true, true);
    assert_eq!(p.placed, [true]);
    assert_eq!(&p.main[..3], &[52, 1, 1], "option 52 first, naming file");
    assert!(p.sname.is_none());
    let mut msg = vec![0u8; 240];
    msg[236..240].copy_from_slice(&[99, 130, 83, 99]);
    msg[108..236].copy_from_slice(&p.file.unwrap());
    msg.extend_from_slice(&p.main);
    msg.push(255);
    assert_eq!(option(&read_options(&msg).0, 43), Some(&data[..]));
}

// ---- replies built from a configuration -------------------------------------------------------

const SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

fn lan() -> Ingress {
    Ingress {
        iface_addrs: vec!["198.18.0.1/24".parse().unwrap()],
        local_dst: Ipv4Addr::BROADCAST,
        served: true,
        interface: Some(0),
    }
}

fn relayed() -> Ingress {
    Ingress { iface_addrs: vec!["198.18.9.1/24".parse().unwrap()], local_dst: SERVER, served: false, interface: None }
}

fn parse_config(text: &str) -> Config {
    Config::parse(Path::new("t.toml"), text, &LocalAddrs::default()).unwrap_or_else(|e| panic!("{e}"))
}

/// A branch LAN with phones, access points, a printer reservation and a relayed shared network.
const BRANCH: &str = r#"
[node]
name = "t"
[dhcp]
interfaces = ["lan0"]
ping_check = false

[[option]]
name = "ntp-servers"
value = ["198.18.0.9"]
[[option]]
name = "domain-search"
value = ["global.example"]

[[class]]
name = "phones"
vendor_class = ["Cisco Systems, Inc. IP Phone*", "*yealink*"]
[[class.option]]
name = "tftp-server-name"
value = "phones.example"
[[class.option]]
name = "tftp-server-address"
value = ["198.18.0.5"]
[[class.option]]
name = "domain-search"
value = ["phones.example"]

[[class]]
name = "lab"
user_class = ["lab"]
[[class.option]]
name = "domain-search"
value = ["lab.example"]
[[class.option]]
name = "tftp-server-name"
value = "lab-tftp.example"

[[class]]
name = "aps"
hw_prefix = ["00:0b:86"]
interface = ["lan0"]
[[class.option]]
name = "vendor-encapsulated-options"
always_send = true
sub = [{ code = 241, type = "ip-list", value = ["198.18.0.10", "198.18.0.11"] }]

[[subnet]]
cidr = "198.18.0.0/24"
pools = ["198.18.0.100-198.18.0.109"]
routers = ["198.18.0.1"]
[[subnet.option]]
name = "classless-static-routes"
value = ["198.18.40.0/24 via 198.18.0.2", "0.0.0.0/0 via 198.18.0.1"]
[[subnet.option]]
name = "domain-search"
value = ["subnet.example"]
[[subnet.pool]]
range = "198.18.0.200-198.18.0.209"
allow_classes = ["phones"]
[[subnet.pool.option]]
name = "ntp-servers"
value = ["198.18.0.20"]

[[subnet]]
cidr = "198.18.9.0/24"
shared_network = "relayed"
pools = ["198.18.9.100"]
routers = ["198.18.9.1"]
lease_secs = 600

[[subnet]]
cidr = "198.18.10.0/24"
shared_network = "relayed"
pools = ["198.18.10.100-198.18.10.110"]
routers = ["198.18.10.1"]
lease_secs = 900

[[reservation]]
name = "printer"
hw = ["02:00:00:00:00:33"]
ip = "198.18.0.33"
[[reservation.option]]
name = "ntp-servers"
value = ["198.18.0.33"]
"#;

struct Client {
    msg: Message,
}

impl Client {
    fn new(kind: MessageType, hw: [u8; 6]) -> Client {
        let mut msg = Message::new_with_id(
            0x5151_0000 + u32::from(hw[5]),
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &hw,
        );
        msg.opts_mut().insert(DhcpOption::MessageType(kind));
        Client { msg }
    }
    fn opt(mut self, o: DhcpOption) -> Client {
        self.msg.opts_mut().insert(o);
        self
    }
    fn prl(self, codes: &[u8]) -> Client {
        self.opt(DhcpOption::ParameterRequestList(codes.iter().map(|c| OptionCode::from(*c)).collect()))
    }
    fn vendor(self, v: &str) -> Client {
        self.opt(DhcpOption::ClassIdentifier(v.as_bytes().to_vec()))
    }
    fn giaddr(mut self, a: Ipv4Addr) -> Client {
        self.msg.set_giaddr(a);
        self
    }
    fn req(&self) -> Request {
        let mut v = Vec::new();
        self.msg.encode(&mut Encoder::new(&mut v)).unwrap();
        parse(&v).unwrap()
    }
}

struct Lab {
    cfg: Config,
    alloc: Allocator,
}

impl Lab {
    fn new(text: &str) -> Lab {
        let cfg = parse_config(text);
        let alloc = Allocator::new(&cfg);
        Lab { cfg, alloc }
    }
    fn send(&mut self, c: &Client, ing: &Ingress) -> Option<Reply> {
        match handle(&self.cfg, &mut self.alloc, &c.req(), ing, 1_000_000, false).answer {
            Answer::Reply { reply, .. } | Answer::Nak { reply, .. } => Some(reply),
            _ => None,
        }
    }
    /// DISCOVER then REQUEST of what was offered; the ACK.
    fn dora(&mut self, c: impl Fn(MessageType) -> Client, ing: &Ingress) -> Reply {
        let offer = self.send(&c(MessageType::Discover), ing).expect("an offer");
        let server = read_options(&offer.bytes).0;
        let sid = Ipv4Addr::from(<[u8; 4]>::try_from(option(&server, 54).unwrap()).unwrap());
        let req = c(MessageType::Request)
            .opt(DhcpOption::ServerIdentifier(sid))
            .opt(DhcpOption::RequestedIpAddress(offer.yiaddr));
        let ack = self.send(&req, ing).expect("an answer");
        assert_eq!(ack.kind, MessageType::Ack);
        assert_eq!(ack.yiaddr, offer.yiaddr);
        ack
    }
}

fn text(d: Option<&[u8]>) -> Option<&str> {
    d.map(|d| std::str::from_utf8(d).unwrap())
}

/// Option 119's names, decoded from DNS wire format.
fn names(d: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut labels = Vec::new();
    let mut i = 0;
    while i < d.len() {
        let n = usize::from(d[i]);
        if n == 0 {
            out.push(labels.join("."));
            labels.clear();
        } else {
            labels.push(String::from_utf8(d[i + 1..i + 1 + n].to_vec()).unwrap());
        }
        i += 1 + n;
    }
    out
}

const PHONE: [u8; 6] = [0x00, 0x1b, 0x54, 0, 0, 1];
const LAPTOP: [u8; 6] = [2, 0, 0, 0, 0, 2];

#[test]
fn a_phone_gets_its_options_and_a_phones_pool_address_a_laptop_neither() {
    let mut lab = Lab::new(BRANCH);
    let phone =
        |k| Client::new(k, PHONE).vendor("Cisco Systems, Inc. IP Phone CP-7945G").prl(&[1, 3, 66, 150, 42, 119]);
    let ack = lab.dora(phone, &lan());
    assert_eq!(ack.yiaddr.octets()[3] / 100, 2, "phones pool: {}", ack.yiaddr);
    let (opts, _) = read_options(&ack.bytes);
    assert_eq!(text(option(&opts, 66)), Some("phones.example"));
    assert_eq!(option(&opts, 150), Some(&[198, 18, 0, 5][..]));
    assert_eq!(option(&opts, 42), Some(&[198, 18, 0, 20][..]), "the phones pool's NTP server");
    assert_eq!(names(option(&opts, 119).unwrap()), ["phones.example"], "class over subnet over global");

    let laptop = |k| Client::new(k, LAPTOP).prl(&[1, 3, 66, 150, 42, 119]);
    let ack = lab.dora(laptop, &lan());
    assert_eq!(ack.yiaddr.octets()[3] / 100, 1, "data pool: {}", ack.yiaddr);
    let (opts, _) = read_options(&ack.bytes);
    assert_eq!(option(&opts, 66), None);
    assert_eq!(option(&opts, 150), None);
    assert_eq!(option(&opts, 42), Some(&[198, 18, 0, 9][..]), "the global NTP server");
    assert_eq!(names(option(&opts, 119).unwrap()), ["subnet.example"]);
}

#[test]
fn a_laptop_asking_for_a_phones_pool_address_is_refused() {
    let mut lab = Lab::new(BRANCH);
    let req =
        Client::new(MessageType::Request, LAPTOP).opt(DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 0, 200)));
    assert_eq!(lab.send(&req, &lan()).unwrap().kind, MessageType::Nak);
    // A phone may (INIT-REBOOT with the address it had).
    let req = Client::new(MessageType::Request, PHONE)
        .vendor("Cisco Systems, Inc. IP Phone 8841")
        .opt(DhcpOption::RequestedIpAddress(Ipv4Addr::new(198, 18, 0, 200)));
    assert_eq!(lab.send(&req, &lan()).unwrap().kind, MessageType::Ack);
}

#[test]
fn the_most_specific_level_wins_and_the_first_class_among_equals() {
    let mut lab = Lab::new(BRANCH);
    // In both phones and lab: phones comes first in the file.
    let both = |k| {
        Client::new(k, PHONE).vendor("x-yealink-T46").opt(DhcpOption::UserClass(b"lab".to_vec())).prl(&[66, 119, 42])
    };
    let (opts, _) = read_options(&lab.dora(both, &lan()).bytes);
    assert_eq!(text(option(&opts, 66)), Some("phones.example"));
    assert_eq!(names(option(&opts, 119).unwrap()), ["phones.example"]);
    // Only lab (user class as an RFC 3004 list of two).
    let lab_only = |k| Client::new(k, LAPTOP).opt(DhcpOption::UserClass(b"\x04corp\x03lab".to_vec())).prl(&[66, 119]);
    let (opts, _) = read_options(&lab.dora(lab_only, &lan()).bytes);
    assert_eq!(text(option(&opts, 66)), Some("lab-tftp.example"));
    assert_eq!(names(option(&opts, 119).unwrap()), ["lab.example"]);
    // The reservation beats the global level.
    let printer = |k| Client::new(k, [2, 0, 0, 0, 0, 0x33]).prl(&[42, 119]);
    let ack = lab.dora(printer, &lan());
    assert_eq!(ack.yiaddr, Ipv4Addr::new(198, 18, 0, 33));
    let (opts, _) = read_options(&ack.bytes);
    assert_eq!(option(&opts, 42), Some(&[198, 18, 0, 33][..]));
    assert_eq!(names(option(&opts, 119).unwrap()), ["subnet.example"]);
}

#[test]
fn options_follow_the_clients_order_and_always_send_ones_come_last() {
    let mut lab = Lab::new(BRANCH);
    let ap = |k| Client::new(k, [0x00, 0x0b, 0x86, 1, 2, 3]).prl(&[121, 3, 1, 42]);
    let ack = lab.dora(ap, &lan());
    let (opts, _) = read_options(&ack.bytes);
    let order: Vec<u8> = opts.iter().map(|(c, _)| *c).filter(|c| ![53, 54, 51, 58, 59].contains(c)).collect();
    assert_eq!(order, [121, 3, 1, 42, 43], "the request list's order, then option 43 (always_send)");
    assert_eq!(option(&opts, 43), Some(&[241, 8, 198, 18, 0, 10, 198, 18, 0, 11][..]));
    assert_eq!(option(&opts, 121), Some(&[24, 198, 18, 40, 198, 18, 0, 2, 0, 198, 18, 0, 1][..]));
}

#[test]
fn a_small_max_message_size_drops_the_options_that_do_not_fit_in_the_clients_order() {
    let long_routes: Vec<String> = (0..60).map(|i| format!("\"198.18.{}.0/24 via 198.18.0.2\"", 100 + i)).collect();
    let text = format!(
        "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n[[subnet]]\ncidr='198.18.0.0/24'\n\
         pools=['198.18.0.100-198.18.0.109']\nrouters=['198.18.0.1']\n[[subnet.option]]\nname='classless-static-routes'\n\
         value=[{}]\n[[subnet.option]]\nname='tftp-server-name'\nvalue='{}'\n",
        long_routes.join(","),
        "t".repeat(200)
    );
    let mut lab = Lab::new(&text);
    // 576: the 480-byte route option cannot fit beside the fixed ones, not even with the
    // header fields; the 200-byte name after it can.
    let small = |k| Client::new(k, LAPTOP).prl(&[121, 66, 3]).opt(DhcpOption::MaxMessageSize(576));
    let ack = lab.dora(small, &lan());
    assert!(ack.bytes.len() <= 576 - 28, "{} bytes", ack.bytes.len());
    let (opts, lens) = read_options(&ack.bytes);
    assert!(option(&opts, 121).is_none());
    assert_eq!(option(&opts, 66).map(<[u8]>::len), Some(200));
    assert!(option(&opts, 3).is_some());
    assert!(lens.iter().all(|l| *l <= 255));
    // 1500: everything, the routes split in two parts (RFC 3396).
    let big = |k| Client::new(k, [2, 0, 0, 0, 0, 9]).prl(&[121, 66, 3]).opt(DhcpOption::MaxMessageSize(1500));
    let ack = lab.dora(big, &lan());
    let (opts, _) = read_options(&ack.bytes);
    assert_eq!(option(&opts, 121).map(<[u8]>::len), Some(60 * 8));
    assert_eq!(ack.bytes[240..].windows(2).filter(|w| w == &[121, 255]).count(), 1, "one full part of 255");
}

#[test]
fn a_full_options_field_overflows_into_file_and_sname_unless_a_boot_file_is_set() {
    let long = |n: usize, c: char| c.to_string().repeat(n);
    let body = |extra: &str| {
        format!(
            "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n[[subnet]]\ncidr='198.18.0.0/24'\n\
             pools=['198.18.0.100-198.18.0.109']\n{extra}\n\
             [[subnet.option]]\nname='tftp-server-name'\nvalue='{}'\n\
             [[subnet.option]]\nname='wpad-url'\nvalue='{}'\n\
             [[subnet.option]]\nname='posix-timezone'\nvalue='{}'\n",
            long(200, 'a'),
            long(100, 'b'),
            long(40, 'c')
        )
    };
    let client = |k| Client::new(k, LAPTOP).prl(&[66, 252, 100]).opt(DhcpOption::MaxMessageSize(576));
    let mut lab = Lab::new(&body(""));
    let ack = lab.dora(client, &lan());
    assert!(ack.bytes.len() <= 548);
    let (opts, _) = read_options(&ack.bytes);
    assert!(option(&opts, 52).is_some(), "overload used");
    for (code, len) in [(66, 200), (252, 100), (100, 40)] {
        assert_eq!(option(&opts, code).map(<[u8]>::len), Some(len), "option {code}");
    }
    // dhcproto, an independent decoder, agrees that file and sname hold options.
    let m = Message::decode(&mut dhcproto::Decoder::new(&ack.bytes)).unwrap();
    assert!(m.opts().get(OptionCode::OptionOverload).is_some());

    let mut lab = Lab::new(&body("[[subnet.option]]\nname='boot-file'\nvalue='pxelinux.0'\n"));
    let ack = lab.dora(client, &lan());
    assert_eq!(&ack.bytes[108..118], b"pxelinux.0", "the boot file keeps its field");
    let (opts, _) = read_options(&ack.bytes);
    if let Some(o) = option(&opts, 52) {
        assert_eq!(o, &[2], "only sname may be overloaded");
    }
    assert_eq!(option(&opts, 66).map(<[u8]>::len), Some(200));
}

#[test]
fn pxe_header_fields_come_from_the_most_specific_level() {
    let text = "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n\
        [[class]]\nname='pxe'\nvendor_class=['PXEClient*']\n\
        [[class.option]]\nname='next-server'\nvalue='198.18.0.5'\n\
        [[class.option]]\nname='boot-file'\nvalue='undionly.kpxe'\n\
        [[class.option]]\nname='vendor-class-identifier'\nvalue='PXEClient'\nalways_send=true\n\
        [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.109']\n";
    let mut lab = Lab::new(text);
    let pxe = |k| Client::new(k, LAPTOP).vendor("PXEClient:Arch:00000:UNDI:002001");
    let ack = lab.dora(pxe, &lan());
    assert_eq!(ack.bytes[20..24], [198, 18, 0, 5], "siaddr");
    assert_eq!(&ack.bytes[108..121], b"undionly.kpxe");
    assert_eq!(text_of(&ack, 60), Some("PXEClient".into()));
    let plain = |k| Client::new(k, [2, 0, 0, 0, 0, 7]);
    let ack = lab.dora(plain, &lan());
    assert_eq!(ack.bytes[20..24], [0; 4]);
    assert_eq!(ack.bytes[108], 0);
}

fn text_of(r: &Reply, code: u8) -> Option<String> {
    option(&read_options(&r.bytes).0, code).map(|d| String::from_utf8(d.to_vec()).unwrap())
}

#[test]
fn a_shared_network_fills_its_subnets_in_order_and_answers_with_the_address_subnet() {
    let mut lab = Lab::new(BRANCH);
    let relay = Ipv4Addr::new(198, 18, 9, 1);
    let a = |k| Client::new(k, [2, 0, 0, 0, 9, 1]).giaddr(relay).prl(&[1, 3]);
    let first = lab.dora(a, &relayed());
    assert_eq!(first.yiaddr, Ipv4Addr::new(198, 18, 9, 100), "the first subnet's pool first");
    let b = |k| Client::new(k, [2, 0, 0, 0, 9, 2]).giaddr(relay).prl(&[1, 3]);
    let second = lab.dora(b, &relayed());
    assert_eq!(second.yiaddr, Ipv4Addr::new(198, 18, 10, 100), "then the second subnet's");
    let (opts, _) = read_options(&second.bytes);
    assert_eq!(option(&opts, 3), Some(&[198, 18, 10, 1][..]), "that subnet's router");
    assert_eq!(option(&opts, 1), Some(&[255, 255, 255, 0][..]));
    assert_eq!(option(&opts, 51), Some(&900u32.to_be_bytes()[..]), "that subnet's lease time");
    assert!(matches!(second.dest, Destination::Relay(r) if r == relay));
    // The client renews its second-subnet address through the same relay: still granted.
    let renew = Client::new(MessageType::Request, [2, 0, 0, 0, 9, 2])
        .giaddr(relay)
        .opt(DhcpOption::RequestedIpAddress(second.yiaddr));
    assert_eq!(lab.send(&renew, &relayed()).unwrap().kind, MessageType::Ack);
    // One address per client per network: asking again yields the same address.
    let again = lab.send(&b(MessageType::Discover), &relayed()).unwrap();
    assert_eq!(again.yiaddr, second.yiaddr);
}

#[test]
fn option_125_joins_one_block_per_enterprise_most_specific_first() {
    let text = "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n\
        [[option]]\nname='vendor-identifying'\nenterprise=3561\nsub=[{ code = 1, type = 'string', value = 'global' }]\n\
        [[option]]\nname='vendor-identifying'\nenterprise=9\nsub=[{ code = 2, type = 'u8', value = 7 }]\n\
        [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.109']\n\
        [[subnet.option]]\nname='vendor-identifying'\nenterprise=3561\nsub=[{ code = 1, type = 'string', value = 'subnet' }]\n";
    let mut lab = Lab::new(text);
    let ack = lab.dora(|k| Client::new(k, LAPTOP).prl(&[125]), &lan());
    let (opts, _) = read_options(&ack.bytes);
    let mut want = Vec::new();
    want.extend_from_slice(&3561u32.to_be_bytes());
    want.extend_from_slice(&[8, 1, 6]);
    want.extend_from_slice(b"subnet");
    want.extend_from_slice(&9u32.to_be_bytes());
    want.extend_from_slice(&[3, 2, 1, 7]);
    assert_eq!(option(&opts, 125), Some(&want[..]));
}

#[test]
fn a_custom_option_by_code_and_by_definition() {
    let conf = "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0']\nping_check=false\n\
        [[option_def]]\nname='avaya'\ncode=242\ntype='string'\n\
        [[option]]\nname='avaya'\nvalue='MCIPADD=198.18.0.7'\n\
        [[option]]\ncode=224\ntype='u16-list'\nvalue=[1, 513]\n\
        [[subnet]]\ncidr='198.18.0.0/24'\npools=['198.18.0.100-198.18.0.109']\n";
    let mut lab = Lab::new(conf);
    let ack = lab.dora(|k| Client::new(k, LAPTOP).prl(&[242, 224]), &lan());
    let (opts, _) = read_options(&ack.bytes);
    assert_eq!(text(option(&opts, 242)), Some("MCIPADD=198.18.0.7"));
    assert_eq!(option(&opts, 224), Some(&[0, 1, 2, 1][..]));
}

// ---- class matching ---------------------------------------------------------------------------

#[test]
fn patterns_match_exactly_by_prefix_suffix_or_substring_and_hex() {
    let p = |t: &str| Pattern::parse(t).unwrap();
    assert_eq!(p("abc").kind, PatternKind::Exact);
    assert!(p("abc").matches(b"abc") && !p("abc").matches(b"abcd"));
    assert!(p("ab*").matches(b"abcd") && !p("ab*").matches(b"xabc"));
    assert!(p("*cd").matches(b"abcd") && !p("*cd").matches(b"cdx"));
    assert!(p("*bc*").matches(b"abcd") && !p("*bc*").matches(b"acbd"));
    assert!(p("0x0004*").matches(&[0, 4, 0, 7]) && !p("0x0004*").matches(&[0, 5]));
    assert!(Pattern::parse("*").is_none() && Pattern::parse("0xzz").is_none());
}

fn raw82(subs: &[(u8, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (c, d) in subs {
        body.push(*c);
        body.push(d.len() as u8);
        body.extend_from_slice(d);
    }
    let mut out = vec![82, body.len() as u8];
    out.extend_from_slice(&body);
    out
}

#[test]
fn relay_agent_sub_options_are_found_and_a_truncated_one_is_not() {
    let r = raw82(&[(1, b"eth0/7"), (2, b"switch-3")]);
    assert_eq!(relay_sub_option(&r, 1), Some(&b"eth0/7"[..]));
    assert_eq!(relay_sub_option(&r, 2), Some(&b"switch-3"[..]));
    assert_eq!(relay_sub_option(&r, 6), None);
    assert_eq!(relay_sub_option(&r[..r.len() - 1], 2), None);
}

#[test]
fn a_class_needs_every_match_it_gives_and_any_pattern_of_each() {
    let text = "[node]\nname='t'\n[dhcp]\ninterfaces=['lan0','lan1']\n\
        [[class]]\nname='port7'\ncircuit_id=['0x0007','*port7']\nremote_id=['sw-*']\nrelay=['198.18.9.0/24']\n\
        [[class]]\nname='ap-lan1'\nhw_prefix=['00:0b:86']\ninterface=['lan1']\n\
        [[subnet]]\ncidr='198.18.0.0/24'\n";
    let cfg = parse_config(text);
    let r = raw82(&[(1, b"ge-0/0/port7"), (2, b"sw-3")]);
    let base = Facts {
        vendor_class: None,
        user_class: None,
        hw: &[0x00, 0x0b, 0x86, 1, 2, 3],
        relay_info: Some(&r),
        interface: None,
        giaddr: Some(Ipv4Addr::new(198, 18, 9, 1)),
    };
    assert_eq!(classify(&cfg.classes, &base), ClassSet::EMPTY.with(0));
    let wrong_relay = Facts { giaddr: Some(Ipv4Addr::new(198, 18, 8, 1)), ..base };
    assert_eq!(classify(&cfg.classes, &wrong_relay), ClassSet::EMPTY);
    let other_remote = raw82(&[(1, &[0, 7]), (2, b"core")]);
    assert_eq!(classify(&cfg.classes, &Facts { relay_info: Some(&other_remote), ..base }), ClassSet::EMPTY);
    let direct = Facts { relay_info: None, giaddr: None, interface: Some(1), ..base };
    assert_eq!(classify(&cfg.classes, &direct), ClassSet::EMPTY.with(1));
    assert_eq!(classify(&cfg.classes, &Facts { interface: Some(0), ..direct }), ClassSet::EMPTY);
}

#[test]
fn a_relayed_request_is_classified_by_its_option_82() {
    let text = "[node]\nname='t'\n[dhcp]\ninterfaces=[]\n\
        [[class]]\nname='port7'\ncircuit_id=['*port7']\n[[class.option]]\nname='log-servers'\nvalue=['198.18.9.77']\n\
        [[subnet]]\ncidr='198.18.9.0/24'\npools=['198.18.9.100-198.18.9.110']\n";
    let mut lab = Lab::new(text);
    let mut c = Client::new(MessageType::Discover, LAPTOP).giaddr(Ipv4Addr::new(198, 18, 9, 1)).prl(&[7]);
    c.msg.opts_mut().insert(DhcpOption::Unknown(UnknownOption::new(OptionCode::Unknown(200), vec![1])));
    let mut bytes = Vec::new();
    c.msg.encode(&mut Encoder::new(&mut bytes)).unwrap();
    // Put the relay's option 82 in front of End, as a relay agent does.
    bytes.pop();
    bytes.extend_from_slice(&raw82(&[(1, b"ge-0/0/port7")]));
    bytes.push(255);
    let req = parse(&bytes).unwrap();
    let out = handle(&lab.cfg, &mut lab.alloc, &req, &relayed(), 1_000_000, false);
    let Answer::Reply { reply, .. } = out.answer else { panic!("no offer") };
    let (opts, _) = read_options(&reply.bytes);
    assert_eq!(option(&opts, 7), Some(&[198, 18, 9, 77][..]));
    assert_eq!(option(&opts, 82), Some(&raw82(&[(1, b"ge-0/0/port7")])[2..]), "option 82 echoed");
}

// ---- the configuration digest -----------------------------------------------------------------

#[test]
fn the_digest_ignores_what_differs_between_the_boxes_and_sees_every_option() {
    let a = parse_config(BRANCH);
    let b = parse_config(&BRANCH.replace("name = \"t\"", "name = \"box-b\"\nstate_dir = \"/srv/tl\"\n# comment"));
    assert_eq!(a.digest, b.digest);
    let c = parse_config(&BRANCH.replace("value = \"phones.example\"", "value = \"phones2.example\""));
    assert_ne!(a.digest, c.digest);
    let d = parse_config(&BRANCH.replace("allow_classes = [\"phones\"]", "allow_classes = [\"lab\"]"));
    assert_ne!(a.digest, d.digest);
    assert_eq!(a.digest.short().len(), 16);
}

#[test]
fn the_shipped_branch_office_example_loads_with_its_classes_pools_and_shared_network() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/branch-office.toml");
    let c = Config::load_with(&path, &LocalAddrs::default()).unwrap();
    assert_eq!(c.dhcp.interfaces, ["lan0.10", "lan0.20", "lan0.30"]);
    let names: Vec<&str> = c.classes.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["phones", "access-points", "pxe-kiosks", "printer-relay"]);
    let printers: Vec<&crate::config::Network> =
        c.networks.iter().filter(|n| n.name.as_deref() == Some("printers")).collect();
    assert_eq!(printers.len(), 1);
    assert_eq!(printers[0].subnets.len(), 2);
    let phones_pool = c.pools.iter().find(|p| !p.allow.is_empty()).unwrap();
    assert!(phones_pool.admits(ClassSet::EMPTY.with(0)) && !phones_pool.admits(ClassSet::EMPTY));
    assert!(c.classes[0].options.get(150).is_some() && c.classes[0].options.get(66).is_some());
    assert!(c.subnets[0].options.get(121).is_some() && c.subnets[0].options.get(252).is_some());
}
