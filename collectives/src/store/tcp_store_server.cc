// TcpStoreServer: one Boost.Asio io_context on one thread owns every piece of
// state (the table, the sessions, the waiters), so nothing here is locked.
#include "neuron/collectives/store/tcp_store_server.h"

#include <atomic>
#include <iostream>
#include <list>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "framing.h"
#include "keepalive.h"
#include "neuron/collectives/store.pb.h"
#include "neuron/collectives/store/auth.h"
#include "neuron/collectives/store/key_value_table.h"
#include "neuron/collectives/store/store.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

namespace asio = boost::asio;
using asio::ip::tcp;
using proto::StoreRequest;
using proto::StoreResponse;

namespace {
constexpr std::uint32_t kProtocolVersion = 1;
// Before a client is authenticated, frames are tiny: no large allocations
// for strangers.
constexpr std::size_t kMaxHandshakeBytes = 4096;
}

class TcpStoreServer::Impl {
 public:
  class Session;
  struct Waiter {
    std::shared_ptr<Session> session;
    StoreRequest request;
    asio::steady_timer timer;
    explicit Waiter(asio::io_context& io) : timer(io) {}
  };

  explicit Impl(TcpStoreServerOptions options);
  ~Impl();

  void Accept();
  void Log(const std::string& line) const { options_.log(line); }
  // Answers the waiters whose keys now all exist.
  void WakeWaiters();
  void DropWaiters(const Session* session);

  TcpStoreServerOptions options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_backoff_{io_};
  KeyValueTable table_;
  std::list<std::shared_ptr<Waiter>> waiters_;
  std::atomic<std::size_t> refused_{0};  // written on the io thread
  std::thread thread_;
};

class TcpStoreServer::Impl::Session
    : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server.io_) {
    boost::system::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? "unknown peer"
               : remote.address().to_string() + ":" + std::to_string(remote.port());
  }

  void Start();
  void Respond(const StoreResponse& response);

 private:
  using Handler = void (Session::*)(const std::string& body);
  void ReadFrame(Handler handler, std::size_t max_bytes);
  // While a GET/WAIT is parked the client sends nothing; a read stays
  // posted anyway, so a client that dies meanwhile is noticed at once (its
  // set-on-close keys, e.g. a lost agent, fire then, not at the timeout).
  void WatchWhileParked();
  void Write(std::string frame, bool then_read, bool then_close);
  void OnAuth(const std::string& body);
  void OnRequest(const std::string& body);
  void Handle(const StoreRequest& request);
  void Refuse(const std::string& reason);
  void Close();

  Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  std::string peer_;
  std::string server_nonce_;
  unsigned char header_[framing::kHeaderBytes] = {};
  std::string body_;
  std::vector<std::pair<std::string, std::string>> on_close_;
  bool closed_ = false;
  bool watching_ = false;
  char watch_byte_ = 0;
};

void TcpStoreServer::Impl::Session::Start() {
  server_nonce_ = auth::RandomBytes(auth::kNonceBytes);
  proto::AuthChallenge challenge;
  challenge.set_protocol_version(kProtocolVersion);
  challenge.set_server_nonce(server_nonce_);
  timer_.expires_after(server_.options_.handshake_timeout);
  auto self = shared_from_this();
  timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec) self->Refuse("no handshake within the handshake timeout");
  });
  Write(framing::Encode(challenge), /*then_read=*/false, /*then_close=*/false);
  ReadFrame(&Session::OnAuth, kMaxHandshakeBytes);
}

void TcpStoreServer::Impl::Session::ReadFrame(Handler handler, std::size_t max_bytes) {
  auto self = shared_from_this();
  asio::async_read(
      socket_, asio::buffer(header_),
      [self, handler, max_bytes](const boost::system::error_code& ec, std::size_t) {
        if (ec) return self->Close();
        const std::uint32_t n = framing::DecodeLength(self->header_);
        if (n > max_bytes) {
          return self->Refuse("message of " + std::to_string(n) +
                              " bytes exceeds the limit of " + std::to_string(max_bytes));
        }
        self->body_.resize(n);
        asio::async_read(
            self->socket_, asio::buffer(self->body_),
            [self, handler](const boost::system::error_code& ec2, std::size_t) {
              if (ec2) return self->Close();
              ((*self).*handler)(self->body_);
            });
      });
}

void TcpStoreServer::Impl::Session::Write(std::string frame, bool then_read,
                                          bool then_close) {
  auto self = shared_from_this();
  auto data = std::make_shared<std::string>(std::move(frame));
  asio::async_write(socket_, asio::buffer(*data),
                    [self, data, then_read, then_close](
                        const boost::system::error_code& ec, std::size_t) {
                      if (ec || then_close) return self->Close();
                      if (then_read) {
                        self->ReadFrame(&Session::OnRequest,
                                        self->server_.options_.max_message_bytes);
                      }
                    });
}

void TcpStoreServer::Impl::Session::OnAuth(const std::string& body) {
  proto::AuthResponse response;
  if (!response.ParseFromString(body)) return Refuse("malformed handshake");
  const std::string expected =
      auth::Proof(server_.options_.secret, auth::kClientLabel, server_nonce_,
                  response.client_nonce());
  if (response.client_nonce().size() != auth::kNonceBytes ||
      !auth::ConstantTimeEqual(expected, response.client_proof())) {
    // Count and log before answering, so a client that sees the refusal
    // also sees it counted.
    ++server_.refused_;
    server_.Log("store: refused client " + peer_ + ": authentication failed");
    proto::AuthResult result;
    result.set_accepted(false);
    result.set_message("authentication failed: wrong job secret");
    Write(framing::Encode(result), false, /*then_close=*/true);
    return;
  }
  timer_.cancel();
  proto::AuthResult result;
  result.set_accepted(true);
  result.set_server_proof(auth::Proof(server_.options_.secret, auth::kServerLabel,
                                      response.client_nonce(), server_nonce_));
  Write(framing::Encode(result), /*then_read=*/true, false);
}

void TcpStoreServer::Impl::Session::OnRequest(const std::string& body) {
  StoreRequest request;
  if (!request.ParseFromString(body)) return Refuse("malformed request");
  try {
    Handle(request);
  } catch (const Error& e) {
    StoreResponse response;
    response.set_status(StoreResponse::BAD_REQUEST);
    response.set_message(e.what());
    Respond(response);
  }
}

void TcpStoreServer::Impl::Session::Handle(const StoreRequest& request) {
  KeyValueTable& table = server_.table_;
  const auto& keys = request.keys();
  const std::vector<std::string> key_list(keys.begin(), keys.end());
  const bool needs_key = request.op() != StoreRequest::NUM_KEYS &&
                         request.op() != StoreRequest::CLEAR_ON_CLOSE;
  NEURON_CHECK(!needs_key || !key_list.empty(), "store request without a key");
  StoreResponse response;
  switch (request.op()) {
    case StoreRequest::SET:
      table.Set(key_list[0], request.value());
      server_.WakeWaiters();
      break;
    case StoreRequest::ADD:
      response.set_number(table.Add(key_list[0], request.delta()));
      server_.WakeWaiters();
      break;
    case StoreRequest::COMPARE_SET:
      response.set_value(
          table.CompareSet(key_list[0], request.expected(), request.value()));
      server_.WakeWaiters();
      break;
    case StoreRequest::CHECK:
      response.set_flag(table.ContainsAll(key_list));
      break;
    case StoreRequest::DELETE:
      response.set_flag(table.Delete(key_list[0]));
      break;
    case StoreRequest::NUM_KEYS:
      response.set_number(table.size());
      break;
    case StoreRequest::SET_ON_CLOSE:
      on_close_.emplace_back(key_list[0], request.value());
      break;
    case StoreRequest::CLEAR_ON_CLOSE:
      on_close_.clear();
      break;
    case StoreRequest::GET:
    case StoreRequest::WAIT: {
      if (table.ContainsAll(key_list)) {
        if (request.op() == StoreRequest::GET) {
          response.set_value(*table.Find(key_list[0]));
        }
        break;
      }
      auto waiter = std::make_shared<Waiter>(server_.io_);
      waiter->session = shared_from_this();
      waiter->request = request;
      waiter->timer.expires_after(Store::Clamp(Store::Duration(request.timeout_ms())));
      std::weak_ptr<Waiter> weak = waiter;
      Impl& server = server_;
      waiter->timer.async_wait([&server, weak](const boost::system::error_code& ec) {
        auto w = weak.lock();
        if (ec || !w) return;
        server.waiters_.remove(w);
        StoreResponse timeout;
        timeout.set_status(StoreResponse::TIMEOUT);
        const auto& k = w->request.keys();
        timeout.set_message("missing keys: " +
                            server.table_.Missing({k.begin(), k.end()}));
        w->session->Respond(timeout);
      });
      server_.waiters_.push_back(std::move(waiter));
      WatchWhileParked();
      return;  // answered later
    }
    default:
      NEURON_CHECK(false, "unknown store op ", static_cast<int>(request.op()));
  }
  Respond(response);
}

void TcpStoreServer::Impl::Session::WatchWhileParked() {
  watching_ = true;
  auto self = shared_from_this();
  socket_.async_read_some(asio::buffer(&watch_byte_, 1),
                          [self](const boost::system::error_code& ec, std::size_t) {
                            if (ec == asio::error::operation_aborted) return;  // answered
                            self->watching_ = false;
                            if (ec) return self->Close();  // the client is gone
                            self->Refuse("sent a request while one was pending");
                          });
}

void TcpStoreServer::Impl::Session::Respond(const StoreResponse& response) {
  if (closed_) return;
  if (watching_) {  // stop watching; the read posted after the answer takes over
    watching_ = false;
    boost::system::error_code ignored;
    socket_.cancel(ignored);
  }
  Write(framing::Encode(response), /*then_read=*/true, false);
}

void TcpStoreServer::Impl::Session::Refuse(const std::string& reason) {
  if (closed_) return;
  ++server_.refused_;
  server_.Log("store: closed connection from " + peer_ + ": " + reason);
  Close();
}

void TcpStoreServer::Impl::Session::Close() {
  if (closed_) return;
  closed_ = true;
  timer_.cancel();
  boost::system::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  server_.DropWaiters(this);
  if (!on_close_.empty()) {
    for (const auto& [key, value] : on_close_) server_.table_.Set(key, value);
    on_close_.clear();
    server_.WakeWaiters();
  }
}

TcpStoreServer::Impl::Impl(TcpStoreServerOptions options)
    : options_(std::move(options)), acceptor_(io_) {
  NEURON_CHECK(!options_.secret.empty(), "store server needs a job secret");
  if (!options_.log) {
    options_.log = [](const std::string& line) { std::cerr << line << std::endl; };
  }
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options_.host, ec);
  NEURON_CHECK(!ec, "store server: '", options_.host, "' is not an IP address");
  const tcp::endpoint endpoint(address, options_.port);
  acceptor_.open(endpoint.protocol());
  acceptor_.set_option(tcp::acceptor::reuse_address(true));
  acceptor_.bind(endpoint, ec);
  if (ec) {
    throw IoError(StrCat("cannot bind store server to ", options_.host, ":",
                         options_.port, ": ",
                         ec == asio::error::address_in_use
                             ? "port " + std::to_string(options_.port) +
                                   " is already in use"
                             : ec.message()));
  }
  acceptor_.listen();
  Accept();
  thread_ = std::thread([this] { io_.run(); });
}

TcpStoreServer::Impl::~Impl() {
  io_.stop();
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::Impl::Accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec,
                                tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors or similar: retry shortly instead of spinning.
      Log("store: cannot accept a connection: " + ec.message());
      accept_backoff_.expires_after(std::chrono::milliseconds(100));
      accept_backoff_.async_wait([this](const boost::system::error_code& e) {
        if (!e) Accept();
      });
      return;
    }
    socket.set_option(tcp::no_delay(true));
    EnableKeepAlive(socket.native_handle());
    std::make_shared<Session>(*this, std::move(socket))->Start();
    Accept();
  });
}

void TcpStoreServer::Impl::WakeWaiters() {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    auto waiter = *it;
    const auto& k = waiter->request.keys();
    if (!table_.ContainsAll({k.begin(), k.end()})) {
      ++it;
      continue;
    }
    it = waiters_.erase(it);
    waiter->timer.cancel();
    StoreResponse response;
    if (waiter->request.op() == StoreRequest::GET) {
      response.set_value(*table_.Find(k[0]));
    }
    waiter->session->Respond(response);
  }
}

void TcpStoreServer::Impl::DropWaiters(const Session* session) {
  waiters_.remove_if([session](const std::shared_ptr<Waiter>& w) {
    if (w->session.get() != session) return false;
    w->timer.cancel();
    return true;
  });
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TcpStoreServer::~TcpStoreServer() = default;

std::uint16_t TcpStoreServer::port() const {
  return impl_->acceptor_.local_endpoint().port();
}

const std::string& TcpStoreServer::host() const { return impl_->options_.host; }

std::size_t TcpStoreServer::refused_count() const { return impl_->refused_; }

}  // namespace neuron::collectives
