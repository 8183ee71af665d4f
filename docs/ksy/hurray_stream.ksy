meta:
  id: hurray_stream
  title: Hurray tensor stream
  file-extension: stream
  license: Apache-2.0
  ks-version: '0.11'
  endian: le
  imports:
    - hurray_descriptor

doc: 'A Hurray stream: a bare stream (descriptor then buffers, tensor after tensor) when it starts with the descriptor magic, else a message stream (message header then payload).'

doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#scope interchange.md § Scope

seq:
  - id: tensors
    type: bare_tensor
    repeat: eos
    if: is_bare
    doc: The tensors of a bare stream.
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#scope interchange.md § Scope
  - id: messages
    type: message
    repeat: eos
    if: not is_bare
    doc: The messages of a message stream.
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing

instances:
  first_word:
    pos: 0
    type: u4
    if: _io.size >= 4
    doc: The first four bytes, as a number (the descriptor magic says a bare stream).
  is_bare:
    value: _io.size >= 4 and first_word == 0x59525248
    doc: The stream starts with the descriptor magic.

types:
  bare_tensor:
    doc: 'One tensor of a bare stream: its descriptor, then its buffers back to back.'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#scope interchange.md § Scope
    seq:
      - id: descriptor
        size: descriptor_length
        type: hurray_descriptor
        doc: The tensor's descriptor, descriptor_length bytes.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/metadata.md#overall-descriptor-structure metadata.md § Overall Descriptor Structure
      - id: buffers
        size: descriptor.buffer_table.buffers[_index].byte_size
        repeat: expr
        repeat-expr: descriptor.buffer_table.buffer_count
        doc: The buffers, in buffer-table order, without padding.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#scope interchange.md § Scope
    instances:
      descriptor_length:
        pos: _io.pos + 6
        type: u4
        doc: descriptor_length of the descriptor that starts here (read before the descriptor).
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/metadata.md#fixed-header metadata.md § Fixed Header
  tensor_descriptor_payload:
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_descriptor-payload interchange.md § TENSOR_DESCRIPTOR Payload
    seq:
      - id: descriptor
        size: descriptor_length
        type: hurray_descriptor
        doc: The tensor's descriptor, descriptor_length bytes.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/metadata.md#overall-descriptor-structure metadata.md § Overall Descriptor Structure
      - id: total_data_bytes
        type: u8
        doc: Bytes the following TENSOR_DATA frames carry in total.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_descriptor-payload interchange.md § TENSOR_DESCRIPTOR Payload
      - id: shard_index
        type: u4
        doc: This shard's index in a parallel transfer; 0 otherwise.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_descriptor-payload interchange.md § TENSOR_DESCRIPTOR Payload
      - id: total_shards
        type: u4
        doc: Shard count of a parallel transfer; 1 otherwise.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_descriptor-payload interchange.md § TENSOR_DESCRIPTOR Payload
    instances:
      descriptor_length:
        pos: _io.pos + 6
        type: u4
        doc: descriptor_length of the descriptor that starts here (read before the descriptor).
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/metadata.md#fixed-header metadata.md § Fixed Header
  tensor_data_payload:
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_data-payload interchange.md § TENSOR_DATA Payload
    seq:
      - id: byte_offset_in_buffer
        type: u8
        doc: Where this frame's bytes start in the tensor's data.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_data-payload interchange.md § TENSOR_DATA Payload
      - id: data
        size-eos: true
        doc: This frame's bytes.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_data-payload interchange.md § TENSOR_DATA Payload
  message:
    doc: 'One message: its header, then payload_length bytes of payload.'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
    seq:
      - id: message_type
        type: u4
        enum: message_type
        doc: What the payload is (MessageType).
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
      - id: stream_id
        type: u4
        doc: Opaque stream identifier; 0 is reserved.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
      - id: payload_length
        type: u4
        doc: Payload bytes after this header.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
      - id: payload
        size: payload_length
        type:
          switch-on: message_type
          cases:
            message_type::tensor_descriptor: tensor_descriptor_payload
            message_type::tensor_data: tensor_data_payload
        doc: The payload; raw bytes for the message types without a table here.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing

enums:
  message_type:
    0x01: client_hello
    0x02: server_hello
    0x03: tensor_request
    0x04: tensor_descriptor
    0x05: tensor_data
    0x06: tensor_data_end
    0x07: tensor_put
    0x08: tensor_put_ack
    0x09: error
    0x0a: ping
    0x0b: pong
    0x0c: rdma_register
    0x0d: rdma_ready
