"""The models' common home: what the bi-encoder and the cross-encoder share (loading, precision, OpenVINO,
weights, the training loop), below the retriever and the reranker that each bring their own head."""
