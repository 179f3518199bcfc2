//! Installing a neighbour entry so a reply can be unicast to a client that has no address yet
//! (RFC 2131 §4.1: the client cannot answer ARP for the address it is being offered). This is
//! what dnsmasq does; it needs CAP_NET_ADMIN. Without it the driver falls back to broadcast,
//! which every client accepts.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;

/// Linux `ATF_COM`: the entry is complete (has a hardware address). Not exported by libc.
const ATF_COM: libc::c_int = 0x02;

pub fn install(fd: RawFd, ifname: &str, ip: Ipv4Addr, hw: [u8; 6]) -> io::Result<()> {
    // SAFETY: arpreq is plain old data; all-zero is a valid starting value.
    let mut req: libc::arpreq = unsafe { std::mem::zeroed() };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size on Linux; arp_pa is a sockaddr.
    unsafe { std::ptr::write(&mut req.arp_pa as *mut libc::sockaddr as *mut libc::sockaddr_in, sin) };
    req.arp_ha.sa_family = libc::ARPHRD_ETHER;
    for (d, s) in req.arp_ha.sa_data.iter_mut().zip(hw) {
        *d = s as libc::c_char;
    }
    req.arp_flags = ATF_COM;
    let name = ifname.as_bytes();
    if name.len() >= req.arp_dev.len() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "interface name too long"));
    }
    for (d, s) in req.arp_dev.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    // SAFETY: fd is an open socket and req a fully initialised arpreq that outlives the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCSARP as _, &req as *const libc::arpreq) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
