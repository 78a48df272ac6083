DROP TABLE batch_lanes;
