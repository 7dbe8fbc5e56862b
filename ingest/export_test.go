package ingest_test

import kafkago "github.com/segmentio/kafka-go"

type kafkaMessage = kafkago.Message
