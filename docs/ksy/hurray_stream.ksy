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
  layout_entry:
    doc: 'One entry of a layout list: a tag byte, and for an extension tag its length-prefixed metadata.'
    seq:
      - id: layout_tag
        type: u1
        enum: layout_tag
        doc: A layout the sender can consume or produce.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#layout-entry-encoding interchange.md § Layout Entry Encoding
      - id: ext_metadata_length
        type: u2
        if: (layout_tag.to_i >= 0xf0) and (layout_tag.to_i <= 0xfe)
        doc: 'Extension tags only: byte length of the metadata that follows (may be 0).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#layout-entry-encoding interchange.md § Layout Entry Encoding
      - id: ext_metadata
        size: ext_metadata_length
        if: (layout_tag.to_i >= 0xf0) and (layout_tag.to_i <= 0xfe)
        doc: 'Extension tags only: opaque hardware or implementation parameters.'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#layout-entry-encoding interchange.md § Layout Entry Encoding
  client_hello:
    doc: The first message of every connection, client to server.
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
    seq:
      - id: protocol_version
        type: u4
        doc: The protocol version the client speaks (1).
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: max_message_size
        type: u4
        doc: Largest payload_length the client accepts.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: capability_flags
        type: u8
        doc: 'What the client can do (bits 4-63 are zero). Bits: enum capability_flag (masks).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#capability-flags interchange.md § Capability Flags
      - id: layout_count
        type: u2
        doc: Entries in supported_layouts.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: supported_layouts
        type: layout_entry
        repeat: expr
        repeat-expr: layout_count
        doc: Layouts the client handles, most preferred first.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: device_count
        type: u2
        doc: Entries in supported_devices.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: supported_devices
        type: u1
        repeat: expr
        repeat-expr: device_count
        enum: device_tag
        doc: Device tags the client handles.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: class_count
        type: u2
        if: not _io.eof
        doc: Entries in supported_memory_classes; the list may be absent (STANDARD only). Absent when the payload ends before it.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: supported_memory_classes
        type: u1
        repeat: expr
        repeat-expr: class_count
        enum: memory_class
        if: not _io.eof
        doc: Memory classes the client handles. Absent when the payload ends before it.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#client_hello-payload interchange.md § CLIENT_HELLO Payload
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  server_hello:
    doc: The server's answer to CLIENT_HELLO, before anything else it sends.
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
    seq:
      - id: protocol_version
        type: u4
        doc: The version the server will use, at most the client's.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: max_message_size
        type: u4
        doc: Largest payload_length the server accepts.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: capability_flags
        type: u8
        doc: 'What the server can do (bits 4-63 are zero). Bits: enum capability_flag (masks).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#capability-flags interchange.md § Capability Flags
      - id: layout_count
        type: u2
        doc: Entries in supported_layouts.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: supported_layouts
        type: layout_entry
        repeat: expr
        repeat-expr: layout_count
        doc: Layouts the server handles, most preferred first.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: device_count
        type: u2
        doc: Entries in supported_devices.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: supported_devices
        type: u1
        repeat: expr
        repeat-expr: device_count
        enum: device_tag
        doc: Device tags the server handles.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: class_count
        type: u2
        if: not _io.eof
        doc: Entries in supported_memory_classes; the list may be absent (STANDARD only). Absent when the payload ends before it.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: supported_memory_classes
        type: u1
        repeat: expr
        repeat-expr: class_count
        enum: memory_class
        if: not _io.eof
        doc: Memory classes the server handles. Absent when the payload ends before it.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#server_hello-payload interchange.md § SERVER_HELLO Payload
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  tensor_request:
    doc: 'Client to server: one tensor, by key, with layout and device preferences.'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
    seq:
      - id: key_length
        type: u4
        doc: Byte length of tensor_key.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: tensor_key
        size: key_length
        doc: The requested tensor's identifier, UTF-8.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: layout_count
        type: u2
        doc: 'Entries in preferred_layouts; 0: no preference.'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: preferred_layouts
        type: layout_entry
        repeat: expr
        repeat-expr: layout_count
        doc: Layouts the client wants, most preferred first.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: preferred_device
        type: u1
        enum: device_tag
        doc: Where the client wants the response buffer.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: min_alignment
        type: u4
        doc: Smallest buffer alignment the client needs; a power of two.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: request_flags
        type: u4
        doc: 'What the client allows (bits 2-31 are zero). Bits: enum request_flag (masks).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_request-payload interchange.md § TENSOR_REQUEST Payload
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  tensor_put:
    doc: 'Client to server: a tensor pushed by key; its data frames follow on the same stream.'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_put-payload interchange.md § TENSOR_PUT Payload
    seq:
      - id: key_length
        type: u4
        doc: Byte length of tensor_key.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_put-payload interchange.md § TENSOR_PUT Payload
      - id: tensor_key
        size: key_length
        doc: The pushed tensor's identifier, UTF-8.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_put-payload interchange.md § TENSOR_PUT Payload
      - id: descriptor_length
        type: u4
        doc: Byte length of descriptor.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_put-payload interchange.md § TENSOR_PUT Payload
      - id: descriptor
        size: descriptor_length
        doc: The tensor descriptor (metadata.md).
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_put-payload interchange.md § TENSOR_PUT Payload
      - id: total_data_bytes
        type: u8
        doc: Bytes the TENSOR_DATA frames that follow carry in total.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#tensor_put-payload interchange.md § TENSOR_PUT Payload
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  tensor_put_ack:
    doc: The server accepted the whole pushed tensor; the payload is empty.
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-types interchange.md § Message Types
    seq:
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  error:
    doc: 'Either direction: the stream it travels on is over.'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#error-payload interchange.md § ERROR Payload
    seq:
      - id: error_code
        type: u4
        enum: error_code
        doc: What went wrong (ErrorCode; 0xF0-0xFE implementation-defined).
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#error-payload interchange.md § ERROR Payload
      - id: message_length
        type: u4
        doc: Byte length of message.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#error-payload interchange.md § ERROR Payload
      - id: message
        size: message_length
        doc: A description for people, UTF-8.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#error-payload interchange.md § ERROR Payload
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  ping:
    doc: 'Keepalives. The spec gives them no payload table: we send them empty and answer a PING with a PONG that echoes its payload (`spec-map.md § Interpretations`).'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-types interchange.md § Message Types
    seq:
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  pong:
    doc: 'Keepalives. The spec gives them no payload table: we send them empty and answer a PING with a PONG that echoes its payload (`spec-map.md § Interpretations`).'
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-types interchange.md § Message Types
    seq:
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  rdma_register:
    doc: An RDMA memory registration. This implementation advertises no RDMA capability, so it parses the message and answers ERROR (`session.rdma.agreed`).
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#rdma_register-payload interchange.md § RDMA_REGISTER Payload
    seq:
      - id: remote_addr
        type: u8
        doc: Address of the registered region on the sender's side.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#rdma_register-payload interchange.md § RDMA_REGISTER Payload
      - id: length
        type: u8
        doc: Region size; equals the preceding descriptor's total_data_bytes.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#rdma_register-payload interchange.md § RDMA_REGISTER Payload
      - id: rkey_length
        type: u4
        doc: Byte length of rkey.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#rdma_register-payload interchange.md § RDMA_REGISTER Payload
      - id: rkey
        size: rkey_length
        doc: Opaque RDMA memory key of the RDMA library.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#rdma_register-payload interchange.md § RDMA_REGISTER Payload
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
  rdma_ready:
    doc: The peer is ready for the RDMA transfer; the payload is empty.
    doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-types interchange.md § Message Types
    seq:
      - id: trailing
        size-eos: true
        doc: 'Payload bytes after the table''s fields: none in a valid message (the session.payload.length rule), but for a PING''s and its PONG''s (the PONG echoes them).'
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing
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
            message_type::client_hello: client_hello
            message_type::server_hello: server_hello
            message_type::tensor_request: tensor_request
            message_type::tensor_put: tensor_put
            message_type::tensor_put_ack: tensor_put_ack
            message_type::error: error
            message_type::ping: ping
            message_type::pong: pong
            message_type::rdma_register: rdma_register
            message_type::rdma_ready: rdma_ready
        doc: The payload; raw bytes for the message types without a table here.
        doc-ref: https://github.com/pgillet/hurray/blob/main/docs/spec/interchange.md#message-framing interchange.md § Message Framing

enums:
  capability_flag:
    0x01: transcoding
    0x02: parallel_streams
    0x04: rdma_data_plane
    0x08: rdma_gpudirect
  layout_tag:
    0x01: row_major
    0x02: column_major
    0x03: strided
    0x04: tiled
    0x05: morton
    0x06: coo
    0x07: csr
    0x08: csc
    0x09: csf
    0x0a: block_paged
    0x0b: composite
    0x40: hilbert
  device_tag:
    0x00: cpu
    0x01: cuda
    0x02: rocm
    0x03: metal
    0x04: vulkan
    0x05: webgpu
    0x06: hexagon
    0x07: level_zero
    0x08: opencl
  memory_class:
    0x00: standard
    0x01: host_pinned
    0x02: unified
    0x03: peer
  request_flag:
    0x01: allow_transcode
    0x02: parallel_ok
  error_code:
    0x01: protocol_version_mismatch
    0x02: unknown_tensor
    0x03: layout_unavailable
    0x04: transcode_limit_exceeded
    0x05: device_unavailable
    0x06: invalid_message
    0x07: message_too_large
    0x08: shard_mismatch
    0xf0:
      id: server_busy
      doc: 'Implementation-defined: this implementation''s value (PrivateErrorCode). No slot came free before the connection''s handshake deadline, or too many wait already (sent instead of SERVER_HELLO); or a PUT''s data would take the server past the memory it holds for unfinished PUTs (on the PUT''s stream).'
    0xf1:
      id: put_refused
      doc: 'Implementation-defined: this implementation''s value (PrivateErrorCode). The server does not accept this TENSOR_PUT: no writable store, a read-only key, too large, or the store could not be written.'
    0xf2:
      id: internal
      doc: 'Implementation-defined: this implementation''s value (PrivateErrorCode). The server failed on its side; the connection ends.'
    0xf3:
      id: timeout
      doc: 'Implementation-defined: this implementation''s value (PrivateErrorCode). The hello or a message did not arrive whole within its deadline; the connection ends.'
    0xf4:
      id: store_full
      doc: 'Implementation-defined: this implementation''s value (PrivateErrorCode). Storing this PUT would take the store past its item or byte limit; the store is unchanged.'
    0xf5:
      id: source_changed
      doc: 'Implementation-defined: this implementation''s value (PrivateErrorCode). The file the item is served from changed or was cut under the server: the stream ends (a frame already under way was padded to its declared length and must be discarded); the session goes on.'
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
