//! The few packets the stack writes itself, outside smoltcp: the RST that
//! refuses a SYN, the ICMP port unreachable that refuses a datagram, and UDP
//! datagrams from the outside (DNS answers, NAT replies) to the VM.
use std::net::{Ipv4Addr, SocketAddrV4};

use smoltcp::wire::{
    Icmpv4Message, Icmpv4Packet, IpAddress, IpProtocol, Ipv4Packet, TcpPacket, TcpSeqNumber, UdpPacket,
};

const IP_HEADER: usize = 20;

fn ipv4(buf: &mut [u8], proto: IpProtocol, src: Ipv4Addr, dst: Ipv4Addr) {
    let total = buf.len() as u16;
    let mut ip = Ipv4Packet::new_unchecked(buf);
    ip.set_version(4);
    ip.set_header_len(IP_HEADER as u8);
    ip.set_dscp(0);
    ip.set_ecn(0);
    ip.set_total_len(total);
    ip.set_ident(0);
    ip.clear_flags();
    ip.set_dont_frag(true);
    ip.set_frag_offset(0);
    ip.set_hop_limit(64);
    ip.set_next_header(proto);
    ip.set_src_addr(src);
    ip.set_dst_addr(dst);
    ip.fill_checksum();
}

/// The RST answering `tcp` (a segment from the VM inside `ip`), so the VM's
/// connect fails at once with ECONNREFUSED.
pub fn tcp_rst(ip: &Ipv4Packet<&[u8]>, tcp: &TcpPacket<&[u8]>) -> Vec<u8> {
    let mut buf = vec![0u8; IP_HEADER + 20];
    let (src, dst) = (ip.dst_addr(), ip.src_addr());
    {
        let mut t = TcpPacket::new_unchecked(&mut buf[IP_HEADER..]);
        t.set_src_port(tcp.dst_port());
        t.set_dst_port(tcp.src_port());
        t.set_header_len(20);
        t.clear_flags();
        t.set_rst(true);
        if tcp.ack() {
            t.set_seq_number(tcp.ack_number());
            t.set_ack_number(TcpSeqNumber(0));
        } else {
            let len = tcp.payload().len() + usize::from(tcp.syn()) + usize::from(tcp.fin());
            t.set_seq_number(TcpSeqNumber(0));
            t.set_ack_number(tcp.seq_number() + len);
            t.set_ack(true);
        }
        t.set_window_len(0);
        t.set_urgent_at(0);
        t.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
    }
    ipv4(&mut buf, IpProtocol::Tcp, src, dst);
    buf
}

/// ICMP port unreachable for `original` (a packet from the VM): a connected
/// UDP socket inside sees ECONNREFUSED.
pub fn port_unreachable(original: &[u8], from: Ipv4Addr, to: Ipv4Addr) -> Vec<u8> {
    // The offending header plus 8 bytes of its payload, as RFC 792 asks.
    let quoted = &original[..original.len().min(IP_HEADER + 8)];
    let mut buf = vec![0u8; IP_HEADER + 8 + quoted.len()];
    {
        let mut icmp = Icmpv4Packet::new_unchecked(&mut buf[IP_HEADER..]);
        icmp.set_msg_type(Icmpv4Message::DstUnreachable);
        icmp.set_msg_code(3);
        icmp.set_echo_ident(0);
        icmp.set_echo_seq_no(0);
        icmp.data_mut()[..quoted.len()].copy_from_slice(quoted);
        icmp.fill_checksum();
    }
    ipv4(&mut buf, IpProtocol::Icmp, from, to);
    buf
}

/// A UDP datagram `from` → `to` carrying `payload`.
pub fn udp(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; IP_HEADER + 8 + payload.len()];
    {
        let mut u = UdpPacket::new_unchecked(&mut buf[IP_HEADER..]);
        u.set_src_port(from.port());
        u.set_dst_port(to.port());
        u.set_len((8 + payload.len()) as u16);
        u.payload_mut().copy_from_slice(payload);
        u.fill_checksum(&IpAddress::Ipv4(*from.ip()), &IpAddress::Ipv4(*to.ip()));
    }
    ipv4(&mut buf, IpProtocol::Udp, *from.ip(), *to.ip());
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_packets_parse_back_with_valid_checksums() {
        let from = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 3), 53);
        let to = SocketAddrV4::new(Ipv4Addr::new(10, 0, 2, 15), 40000);
        let pkt = udp(from, to, b"hello");
        let ip = Ipv4Packet::new_checked(&pkt[..]).unwrap();
        assert!(ip.verify_checksum());
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(u.verify_checksum(&IpAddress::Ipv4(from.ip().to_owned()), &IpAddress::Ipv4(*to.ip())));
        assert_eq!(u.payload(), b"hello");
        assert_eq!(u.dst_port(), 40000);

        let unreach = port_unreachable(&pkt, Ipv4Addr::new(10, 0, 2, 2), Ipv4Addr::new(10, 0, 2, 15));
        let ip = Ipv4Packet::new_checked(&unreach[..]).unwrap();
        let icmp = Icmpv4Packet::new_checked(ip.payload()).unwrap();
        assert!(icmp.verify_checksum());
        assert_eq!(icmp.msg_type(), Icmpv4Message::DstUnreachable);
        assert_eq!(icmp.msg_code(), 3);
    }
}
