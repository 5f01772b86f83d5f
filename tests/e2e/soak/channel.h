// The control connection: a TCP socket on which the two sides exchange
// their QP numbers, PSNs, GIDs and keys, agree on the plan, and report
// results. Either side failing closes it, which the other notices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace soak {

class Channel {
 public:
  // Server: accepts one connection on `port` (any local address).
  static Channel Accept(uint16_t port);
  // Client: connects, retrying while the server is not listening yet.
  static Channel Connect(const std::string& host, uint16_t port);
  Channel(Channel&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Channel(const Channel&) = delete;
  ~Channel();

  // Whole-buffer transfers; a closed or failed connection is fatal (Die).
  void Send(const void* data, size_t len);
  void Recv(void* data, size_t len);
  template <typename T> void Send(const T& v) { Send(&v, sizeof v); }
  template <typename T> void Recv(T* v) { Recv(v, sizeof *v); }

  // Without blocking: true once the peer has closed the connection or sent
  // something unexpected, i.e. it gave up. Used while the data path runs.
  bool PeerGone();

 private:
  explicit Channel(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace soak
