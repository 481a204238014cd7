//! The port workload's calls (DESIGN 13.1): a URL of a fleet sandbox's served port asked for,
//! sometimes a stop and a start of it, and then a request through the preview proxy with the
//! URL's token, whose answer U1 checks was given by the run the token was issued for.

use berth_proto::v1 as pb;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;

use super::{CALL_TIMEOUT, Client};
use crate::invariants::{Invariant, u1_port_tokens};
use crate::net;
use crate::supervisor::SERVED_PORT;
use crate::trace::Kind;

impl Client {
    pub(super) async fn port_operation(&mut self, name: &str) {
        let request = pb::GetPortUrlRequest { name: name.to_string(), port: SERVED_PORT.into() };
        let mut c = self.sandboxes();
        let Some(url) = self.unrecorded_call(format!("url of {name}:{SERVED_PORT}"), c.get_port_url(request)).await
        else {
            return;
        };
        match self.draw.below(4) {
            0 => self.stop_start_wait(name).await,
            1 => tokio::time::sleep(self.draw.millis(0, 3_000)).await,
            _ => {}
        }
        let what = format!("GET {name}:{SERVED_PORT} with the token of run {}", url.generation);
        self.world.event(self.actor.clone(), Kind::Call, what.clone());
        let answer = tokio::time::timeout(CALL_TIMEOUT, self.through_proxy(name, &url.token)).await;
        let detail = match answer {
            Ok(Ok((status, body))) => {
                if let Some(problem) =
                    u1_port_tokens::served_by_another_run(name, &url.sandbox_id, url.generation, status, &body)
                {
                    self.world.violate(Invariant::U1, problem);
                }
                format!("{what} -> {status} {body}")
            }
            Ok(Err(e)) => format!("{what} -> {e}"),
            Err(_) => format!("{what} -> no answer"),
        };
        self.world.event(self.actor.clone(), Kind::Reply, detail);
    }

    /// One GET of the served port of `name` through the current gateway's preview proxy: the
    /// status and the body.
    async fn through_proxy(&self, name: &str, token: &str) -> Result<(u16, String), String> {
        let host = net::gateway_host(self.at);
        let stream =
            turmoil::net::TcpStream::connect((host.as_str(), net::PROXY_PORT)).await.map_err(|e| e.to_string())?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let request = http::Request::get(format!("/sandboxes/{name}/ports/{SERVED_PORT}/"))
            .header(http::header::HOST, host)
            .header("x-berth-port-token", token)
            .body(http_body_util::Empty::<hyper::body::Bytes>::new())
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}
