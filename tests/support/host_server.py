"""The test host's servers (run inside its network namespace, the address as
the argument): HTTP on 8080 answering every GET with a fixed body, UDP echo
on 8081. Shared by the Rust suites (tests/support/net.rs) and pytest
(tests/conftest.py's test_host fixture)."""
import http.server, socket, sys, threading


def main(addr):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, 8081))
    def echo():
        while True:
            data, peer = u.recvfrom(65536)
            u.sendto(b"echo:" + data, peer)
    threading.Thread(target=echo, daemon=True).start()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"hello from the test host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    # Room for every connection a test opens at once: beyond the default
    # backlog of 5, the host's connects would wait for SYN-ACK retransmits.
    http.server.ThreadingHTTPServer.request_queue_size = 1024
    http.server.ThreadingHTTPServer((addr, 8080), H).serve_forever()


# A module under tests/, so guarded: pytest must never run it by importing it.
if __name__ == "__main__":
    main(sys.argv[1])
