//! Generated gRPC code for `proto/ferroplasma/cluster/v1/cluster.proto`.

#![allow(missing_docs, clippy::all, missing_debug_implementations)]

tonic::include_proto!("ferroplasma.cluster.v1");
