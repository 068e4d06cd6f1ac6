//! The celerity transformer end to end against moto: handlers, their handlerConfig, and the backing types (datastore, queue, topic, bucket, config) with the access links the transform declares.
