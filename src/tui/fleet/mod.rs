//! The fleet's terminal UI.

use std::time::Duration;

use gpudiag_fleet::client::Client;
use gpudiag_fleet::read::ReadRequest;
use gpudiag_model::error::Error;

pub fn run(_client: Client, _request: ReadRequest, _interval: Duration) -> Result<i32, Error> {
    Err(Error::CannotRun("the fleet UI is not built yet".to_owned()))
}
