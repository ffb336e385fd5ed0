//! A minimal HTTP/1.1 GET over 127.0.0.1, enough for health and admin endpoints.

#![allow(clippy::unwrap_used, dead_code)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `(status, body)` of `GET path` on `127.0.0.1:port`.
pub async fn get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    get_at(std::net::SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// `(status, body)` of `GET path` on `addr`.
pub async fn get_at(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line in {text:?}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}
