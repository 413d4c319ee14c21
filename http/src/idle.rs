//! Connections that wait too long for a request are closed, so a client that connects and sends
//! nothing cannot hold a connection open.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a connection may wait for a request (the first, or the next one on
/// a kept-alive connection) before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A listener whose connections are closed when they wait longer than a
/// timeout for a request (see [`IdleTimeout`]).
#[derive(Debug)]
pub struct IdleListener {
    inner: tokio::net::TcpListener,
    timeout: Duration,
}

impl IdleListener {
    /// Wrap `inner`.
    pub fn new(inner: tokio::net::TcpListener, timeout: Duration) -> Self {
        Self { inner, timeout }
    }
}

impl axum::serve::Listener for IdleListener {
    type Io = IdleTimeout<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (IdleTimeout::new(io, self.timeout), addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection that fails with `TimedOut` (and is closed) when it waits longer
/// than its timeout for a request: from when it opens, or from the last bytes
/// written to the next bytes read; and when a request, once its first bytes
/// arrived, is still being read a timeout later (a slow sender trickling its
/// headers or body). A peer that connects and sends nothing, keeps an idle
/// connection or sends a byte now and then is let go. Time spent handling a
/// request counts too where the server keeps reading meanwhile (hyper's HTTP/1
/// watches for a closed connection, HTTP/2 reads frames): a response must start
/// within the timeout of its request's first bytes, which carma's handlers (a few
/// seconds at most, against kube-scheduler's 5 s extender timeout) stay far below.
#[derive(Debug)]
pub struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Bytes were written since the last read (or nothing happened yet).
    awaiting_request: bool,
    /// Waiting for a request: when the wait ends; reading one: when it must have arrived.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> IdleTimeout<S> {
    /// Wrap `inner`.
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            awaiting_request: true,
            deadline: None,
        }
    }

    /// Bytes were written: the wait for the next request starts now. The
    /// deadline is polled here, with the writer's waker, because the reader
    /// may already be parked on the socket and not poll again until it fires.
    fn wrote(&mut self, cx: &mut Context<'_>) {
        self.awaiting_request = true;
        let at = tokio::time::Instant::now() + self.timeout;
        let deadline = match &mut self.deadline {
            Some(d) => {
                d.as_mut().reset(at);
                d
            }
            None => self.deadline.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        let _ = deadline.as_mut().poll(cx);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && this.awaiting_request {
                    // A request starts: all of it must arrive within the timeout.
                    this.awaiting_request = false;
                    let at = tokio::time::Instant::now() + this.timeout;
                    match &mut this.deadline {
                        Some(d) => d.as_mut().reset(at),
                        None => this.deadline = Some(Box::pin(tokio::time::sleep_until(at))),
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        if this.awaiting_request {
                            format!("no request within {timeout:?}")
                        } else {
                            format!(
                                "the request did not arrive within {timeout:?} of its first bytes"
                            )
                        },
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.wrote(cx);
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.wrote(cx);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
