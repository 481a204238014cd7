//! The connection a supervisor opens to the gateway for each connection into its run (DESIGN
//! 13.1). It is not gRPC: after its opening, a download's bytes cross the gateway's endpoint as
//! they are, with no framing of their own, and the gateway hands the connection itself to the
//! preview proxy or the port-forward that asked for it. It comes to the same endpoint as the
//! supervisor's gRPC (its socket, or its address), told apart by its first bytes: an HTTP/2
//! client's begin with `PRI`.

use std::io;

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::v1::IngressOpen;

/// What an ingress connection begins with.
pub const PREAMBLE: &[u8] = b"BERTH-INGRESS/1\n";
/// The longest opening taken: a token and a reason fit many times over.
const MAX_OPEN: u32 = 64 * 1024;

/// Opens an ingress connection on `connection`: the preamble and `open`.
pub async fn write_open(connection: &mut (impl AsyncWrite + Unpin), open: &IngressOpen) -> io::Result<()> {
    let body = open.encode_to_vec();
    let len = u32::try_from(body.len()).ok().filter(|len| *len <= MAX_OPEN).ok_or_else(|| too_long(body.len()))?;
    let mut head = Vec::with_capacity(PREAMBLE.len() + 4 + body.len());
    head.extend_from_slice(PREAMBLE);
    head.extend_from_slice(&len.to_be_bytes());
    head.extend_from_slice(&body);
    connection.write_all(&head).await?;
    connection.flush().await
}

/// The opening of an ingress connection whose preamble was read; nothing after it is read.
pub async fn read_open(connection: &mut (impl AsyncRead + Unpin)) -> io::Result<IngressOpen> {
    let len = connection.read_u32().await?;
    if len > MAX_OPEN {
        return Err(too_long(len as usize));
    }
    let mut body = vec![0; len as usize];
    connection.read_exact(&mut body).await?;
    IngressOpen::decode(body.as_slice()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn too_long(len: usize) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("an ingress opening of {len} bytes (at most {MAX_OPEN})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_opening_reads_back_as_written_and_leaves_what_follows() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let open = IngressOpen { runtime_token: "t".repeat(300), tunnel: 7, refused: String::new() };
        write_open(&mut a, &open).await.unwrap();
        a.write_all(b"after").await.unwrap();
        let mut preamble = vec![0; PREAMBLE.len()];
        b.read_exact(&mut preamble).await.unwrap();
        assert_eq!(preamble, PREAMBLE);
        assert_eq!(read_open(&mut b).await.unwrap(), open);
        let mut rest = [0; 5];
        b.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"after");
    }

    #[tokio::test]
    async fn an_opening_too_long_or_not_a_message_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&(MAX_OPEN + 1).to_be_bytes()).await.unwrap();
        assert_eq!(read_open(&mut b).await.unwrap_err().kind(), io::ErrorKind::InvalidData);
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(&3u32.to_be_bytes()).await.unwrap();
        a.write_all(&[0xff, 0xff, 0xff]).await.unwrap();
        assert_eq!(read_open(&mut b).await.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
