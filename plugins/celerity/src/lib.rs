//! Transformer `celerity-2023-04-20`: expands abstract celerity/* resources into
//! concrete aws/* resources. Not yet started.
