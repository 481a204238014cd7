//! The codec of the generated servers: prost's, except that a request that cannot be decoded
//! (a bad varint, a string that is not UTF-8) is the caller's fault, INVALID_ARGUMENT, where
//! prost's codec answers INTERNAL, which DESIGN 3.7 keeps for bugs. Encoding, and decoding any
//! valid message, is prost's own. Clients keep prost's codec: to them an undecodable reply is
//! the server's fault, INTERNAL as gRPC says.

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] with decoding failures reported as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct RequestCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for RequestCodec<T, U> {
    fn default() -> Self {
        Self(ProstCodec::default())
    }
}

impl<T, U> Codec for RequestCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`] with decoding failures reported as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // prost's decoder fails only on bytes that are not a valid message.
        self.0
            .decode(buf)
            .map_err(|e| Status::invalid_argument(format!("the request could not be decoded: {}", e.message())))
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
