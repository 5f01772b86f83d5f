#include "tests/e2e/soak/channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tests/e2e/soak/common.h"

namespace soak {

Channel Channel::Accept(uint16_t port) {
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) Die(fmt::format("socket: {}", std::strerror(errno)));
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    Die(fmt::format("cannot listen on TCP port {}: {}", port, std::strerror(errno)));
  }
  if (listen(ls, 1) != 0) Die(fmt::format("listen: {}", std::strerror(errno)));
  int fd = accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) Die(fmt::format("accept: {}", std::strerror(errno)));
  close(ls);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return Channel(fd);
}

Channel Channel::Connect(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0) {
    Die(fmt::format("cannot resolve {}: {}", host, gai_strerror(e)));
  }
  // The server may not be listening yet: retry for a while (the global
  // timeout bounds it).
  for (int attempt = 0;; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) Die(fmt::format("socket: {}", std::strerror(errno)));
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      freeaddrinfo(res);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return Channel(fd);
    }
    const int e = errno;
    close(fd);
    if (e != ECONNREFUSED || attempt >= 300) {
      Die(fmt::format("cannot connect to {}:{}: {}", host, port, std::strerror(e)));
    }
    usleep(100 * 1000);
  }
}

Channel::~Channel() {
  if (fd_ >= 0) close(fd_);
}

void Channel::Send(const void* data, size_t len) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = send(fd_, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) Die(fmt::format("the peer closed the control connection ({})", std::strerror(errno)));
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void Channel::Recv(void* data, size_t len) {
  auto* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = recv(fd_, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) Die("the peer closed the control connection (it failed; see its output)");
    if (n < 0) Die(fmt::format("control connection: {}", std::strerror(errno)));
    p += n;
    len -= static_cast<size_t>(n);
  }
}

bool Channel::PeerGone() {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP)) return true;
  char c;
  ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

}  // namespace soak
