// TcpStore: a synchronous client. Each call runs a private io_context until
// the answer arrives or the call's deadline passes; after a deadline the
// connection is in an unknown state and every later call fails fast.
#include "neuron/collectives/store/tcp_store.h"

#include <thread>

#include <boost/asio.hpp>

#include "framing.h"
#include "keepalive.h"
#include "neuron/collectives/store.pb.h"
#include "neuron/collectives/store/auth.h"
#include "neuron/runtime/error.h"

namespace neuron::collectives {

namespace asio = boost::asio;
using asio::ip::tcp;
using proto::StoreRequest;
using proto::StoreResponse;
using std::chrono::milliseconds;

namespace {
// Time a server-side wait may take beyond its own timeout to answer.
constexpr milliseconds kAnswerSlack = std::chrono::seconds(10);
constexpr std::size_t kMaxResponseBytes = 256u << 20;

const char* OpName(StoreRequest::Op op) {
  return StoreRequest::Op_Name(op).c_str();
}
}  // namespace

class TcpStore::Connection {
 public:
  explicit Connection(TcpStoreOptions options)
      : options_(std::move(options)), socket_(io_) {}

  std::string endpoint() const {
    return options_.host + ":" + std::to_string(options_.port);
  }
  const TcpStoreOptions& options() const { return options_; }

  void Connect();
  void Authenticate();
  void Send(const google::protobuf::MessageLite& message, milliseconds deadline,
            const char* what);
  std::string Receive(milliseconds deadline, const char* what);
  // Sends `request`, waits for its answer, turns error statuses into throws.
  StoreResponse Call(const StoreRequest& request, milliseconds deadline);

 private:
  // Runs io_ until `done` or `deadline`; throws TimeoutError naming `what`.
  void RunUntil(const bool& done, milliseconds deadline, const char* what);
  void CheckUsable() const {
    if (broken_) throw IoError("store connection to " + endpoint() + " is lost");
  }

  TcpStoreOptions options_;
  asio::io_context io_;
  tcp::socket socket_;
  bool broken_ = false;
};

void TcpStore::Connection::Connect() {
  const auto start = std::chrono::steady_clock::now();
  const auto give_up = start + options_.connect_timeout;
  milliseconds backoff(20);
  std::string last_error = "no attempt";
  tcp::resolver resolver(io_);
  while (true) {
    boost::system::error_code ec;
    auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port), ec);
    if (!ec) {
      socket_ = tcp::socket(io_);
      bool done = false;
      asio::async_connect(socket_, endpoints,
                          [&](const boost::system::error_code& e, const tcp::endpoint&) {
                            ec = e;
                            done = true;
                          });
      const auto left = std::chrono::duration_cast<milliseconds>(
          give_up - std::chrono::steady_clock::now());
      io_.restart();
      io_.run_for(std::max(left, milliseconds(1)));
      if (!done) {
        socket_.close();
        io_.restart();
        io_.run();  // deliver the cancellation
        ec = asio::error::timed_out;
      }
      if (done && !ec) {
        socket_.set_option(tcp::no_delay(true));
        EnableKeepAlive(socket_.native_handle());
        return;
      }
    }
    last_error = ec.message();
    if (std::chrono::steady_clock::now() + backoff >= give_up) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
  throw TimeoutError(StrCat("store server ", endpoint(), " did not answer within ",
                            options_.connect_timeout.count(), " ms (", last_error,
                            ")"));
}

void TcpStore::Connection::Authenticate() {
  const milliseconds deadline = options_.call_timeout;
  proto::AuthChallenge challenge;
  if (!challenge.ParseFromString(Receive(deadline, "handshake"))) {
    throw IoError("store server " + endpoint() + " sent a malformed handshake");
  }
  const std::string nonce = auth::RandomBytes(auth::kNonceBytes);
  proto::AuthResponse response;
  response.set_client_nonce(nonce);
  response.set_client_proof(auth::Proof(options_.secret, auth::kClientLabel,
                                        challenge.server_nonce(), nonce));
  Send(response, deadline, "handshake");
  proto::AuthResult result;
  if (!result.ParseFromString(Receive(deadline, "handshake"))) {
    throw IoError("store server " + endpoint() + " sent a malformed handshake");
  }
  if (!result.accepted()) {
    broken_ = true;
    throw RemoteError("store server " + endpoint() + " refused this client: " +
                      result.message());
  }
  const std::string expected = auth::Proof(options_.secret, auth::kServerLabel,
                                           nonce, challenge.server_nonce());
  if (!auth::ConstantTimeEqual(expected, result.server_proof())) {
    broken_ = true;
    throw RemoteError("store server " + endpoint() +
                      " could not prove it holds the job secret");
  }
}

void TcpStore::Connection::RunUntil(const bool& done, milliseconds deadline,
                                    const char* what) {
  io_.restart();
  io_.run_for(deadline);
  if (done) return;
  broken_ = true;
  boost::system::error_code ignored;
  socket_.close(ignored);
  io_.restart();
  io_.run();
  throw TimeoutError(StrCat("store server ", endpoint(), " did not answer ", what,
                            " within ", deadline.count(), " ms"));
}

void TcpStore::Connection::Send(const google::protobuf::MessageLite& message,
                                milliseconds deadline, const char* what) {
  CheckUsable();
  const std::string frame = framing::Encode(message);
  bool done = false;
  boost::system::error_code ec;
  asio::async_write(socket_, asio::buffer(frame),
                    [&](const boost::system::error_code& e, std::size_t) {
                      ec = e;
                      done = true;
                    });
  RunUntil(done, deadline, what);
  if (ec) {
    broken_ = true;
    throw IoError(StrCat("store server ", endpoint(), " lost during ", what, ": ",
                         ec.message()));
  }
}

std::string TcpStore::Connection::Receive(milliseconds deadline, const char* what) {
  CheckUsable();
  unsigned char header[framing::kHeaderBytes];
  std::string body;
  bool done = false;
  boost::system::error_code ec;
  asio::async_read(socket_, asio::buffer(header),
                   [&](const boost::system::error_code& e, std::size_t) {
                     if (e) {
                       ec = e;
                       done = true;
                       return;
                     }
                     const std::uint32_t n = framing::DecodeLength(header);
                     if (n > kMaxResponseBytes) {
                       ec = asio::error::message_size;
                       done = true;
                       return;
                     }
                     body.resize(n);
                     asio::async_read(socket_, asio::buffer(body),
                                      [&](const boost::system::error_code& e2,
                                          std::size_t) {
                                        ec = e2;
                                        done = true;
                                      });
                   });
  RunUntil(done, deadline, what);
  if (ec) {
    broken_ = true;
    throw IoError(StrCat("store server ", endpoint(), " lost during ", what, ": ",
                         ec == asio::error::eof ? "connection closed" : ec.message()));
  }
  return body;
}

StoreResponse TcpStore::Connection::Call(const StoreRequest& request,
                                         milliseconds deadline) {
  const char* what = OpName(request.op());
  Send(request, deadline, what);
  StoreResponse response;
  if (!response.ParseFromString(Receive(deadline, what))) {
    throw IoError(StrCat("store server ", endpoint(), " sent a malformed answer to ",
                         what));
  }
  switch (response.status()) {
    case StoreResponse::OK:
      return response;
    case StoreResponse::TIMEOUT:
      throw TimeoutError(StrCat("store ", what, " timed out after ",
                                request.timeout_ms(), " ms; ", response.message()));
    default:
      throw InvalidUsage(StrCat("store ", what, " rejected: ", response.message()));
  }
}

namespace {

StoreRequest MakeRequest(StoreRequest::Op op, std::vector<std::string> keys) {
  StoreRequest request;
  request.set_op(op);
  for (auto& k : keys) request.add_keys(std::move(k));
  return request;
}

}  // namespace

TcpStore::TcpStore(TcpStoreOptions options)
    : connection_(std::make_unique<Connection>(std::move(options))) {
  NEURON_CHECK(!connection_->options().secret.empty(),
               "store client for ", connection_->endpoint(), " needs a job secret");
  connection_->Connect();
  connection_->Authenticate();
}

TcpStore::~TcpStore() = default;

std::string TcpStore::endpoint() const { return connection_->endpoint(); }

#define NEURON_STORE_CALL(request, deadline)        \
  [&] {                                             \
    std::lock_guard<std::mutex> lock(mutex_);       \
    return connection_->Call(request, deadline);   \
  }()

void TcpStore::Set(const std::string& key, const std::string& value) {
  auto request = MakeRequest(StoreRequest::SET, {key});
  request.set_value(value);
  NEURON_STORE_CALL(request, connection_->options().call_timeout);
}

std::string TcpStore::Get(const std::string& key, Duration timeout) {
  timeout = Clamp(timeout);
  auto request = MakeRequest(StoreRequest::GET, {key});
  request.set_timeout_ms(timeout.count());
  return NEURON_STORE_CALL(request, timeout + kAnswerSlack).value();
}

std::int64_t TcpStore::Add(const std::string& key, std::int64_t delta) {
  auto request = MakeRequest(StoreRequest::ADD, {key});
  request.set_delta(delta);
  return NEURON_STORE_CALL(request, connection_->options().call_timeout).number();
}

std::string TcpStore::CompareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) {
  auto request = MakeRequest(StoreRequest::COMPARE_SET, {key});
  request.set_expected(expected);
  request.set_value(desired);
  return NEURON_STORE_CALL(request, connection_->options().call_timeout).value();
}

void TcpStore::Wait(const std::vector<std::string>& keys, Duration timeout) {
  timeout = Clamp(timeout);
  auto request = MakeRequest(StoreRequest::WAIT, keys);
  request.set_timeout_ms(timeout.count());
  NEURON_STORE_CALL(request, timeout + kAnswerSlack);
}

bool TcpStore::Check(const std::vector<std::string>& keys) {
  auto request = MakeRequest(StoreRequest::CHECK, keys);
  return NEURON_STORE_CALL(request, connection_->options().call_timeout).flag();
}

bool TcpStore::Delete(const std::string& key) {
  auto request = MakeRequest(StoreRequest::DELETE, {key});
  return NEURON_STORE_CALL(request, connection_->options().call_timeout).flag();
}

std::int64_t TcpStore::NumKeys() {
  auto request = MakeRequest(StoreRequest::NUM_KEYS, {});
  return NEURON_STORE_CALL(request, connection_->options().call_timeout).number();
}

void TcpStore::SetOnClose(const std::string& key, const std::string& value) {
  auto request = MakeRequest(StoreRequest::SET_ON_CLOSE, {key});
  request.set_value(value);
  NEURON_STORE_CALL(request, connection_->options().call_timeout);
}

void TcpStore::ClearOnClose() {
  auto request = MakeRequest(StoreRequest::CLEAR_ON_CLOSE, {});
  NEURON_STORE_CALL(request, connection_->options().call_timeout);
}

#undef NEURON_STORE_CALL

}  // namespace neuron::collectives
