//! berth-gateway: executes what berth-core decides, against a store and a runtime driver.

pub mod store;
