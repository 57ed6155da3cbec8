//! Where the platform may connect on a tenant's word.

use std::net::IpAddr;

/// Addresses the platform never connects to on a tenant's word (a webhook, an identity
/// provider): this machine, private networks, link-local (cloud metadata), and the like,
/// also when carried inside an IPv6 address.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || a.is_multicast()
                || a.octets()[0] == 100 && (a.octets()[1] & 0xc0) == 64 // carrier-grade NAT
                || a.octets()[0] == 0
                || a.octets()[0] >= 240 // reserved
        }
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = a.segments();
            let low32 = || std::net::Ipv4Addr::from(((s[6] as u32) << 16) | s[7] as u32);
            // Addresses that carry an IPv4 one: reached through it, judged by it.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] // NAT64
                || (s[..6] == [0; 6] && !a.is_loopback() && !a.is_unspecified())
            // IPv4-compatible
            {
                return is_internal(IpAddr::V4(low32()));
            }
            if s[0] == 0x2002 {
                // 6to4
                let v4 = std::net::Ipv4Addr::from(((s[1] as u32) << 16) | s[2] as u32);
                return is_internal(IpAddr::V4(v4));
            }
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local
                || (s[0] & 0xffc0) == 0xfe80 // link-local
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1) // local-use NAT64
                || (s[0] == 0x2001 && s[1] == 0) // Teredo: an IPv4 tunnel
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_addresses_are_refused() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "::7f00:1",
            "2002:a00:1::1",
            "2001:0:4136:e378::1",
            "64:ff9b:1::1",
            "240.0.0.1",
            "255.255.255.254",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "2606:4700::1111",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }
}
