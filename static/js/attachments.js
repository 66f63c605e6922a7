// Attachments: files picked, pasted or dropped on the composer are uploaded at once
// (POST /api/sessions/{id}/attachments) and shown as removable thumbnails; the message
// then names them by id. A turn shows its attachments the same way, read-only.
// On a project's page there is no session yet: files wait in the tray and go up once the
// first message has created one (`defer`, `uploadTo`).

import { ApiError, NetworkError, csrfToken, toLogin } from './api.js';
import { h } from './dom.js';
import { mentionChip } from './mentions.js';

export function contentUrl(id) {
  return `/api/attachments/${encodeURIComponent(id)}/content`;
}

export function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(bytes < 10 * 1024 ? 1 : 0)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

// A file's badge: its extension (no icon font needed), e.g. TXT, MD, PY.
function badge(name) {
  const match = /\.([A-Za-z0-9]{1,4})$/.exec(name);
  return match ? match[1].toUpperCase() : 'FILE';
}

const isImage = (mime) => typeof mime === 'string' && mime.startsWith('image/');

// The server's type rule (runs/attachments.py): an image by its first bytes (PNG, JPEG, GIF,
// WebP), else UTF-8 text without NUL, never empty. On a project's page the files are checked by it
// before the first message creates a session, so a refused file leaves no empty session behind.
const UNSUPPORTED = 'Only images (PNG, JPEG, GIF, WebP) and UTF-8 text files can be attached.';
const bytesOf = (text) => Uint8Array.from(text, (c) => c.charCodeAt(0));
const IMAGE_MAGIC = ['\x89PNG\r\n\x1a\n', '\xff\xd8\xff', 'GIF87a', 'GIF89a'].map(bytesOf);
const RIFF = bytesOf('RIFF');
const WEBP = bytesOf('WEBP');
const startsWith = (bytes, magic, at = 0) => magic.every((byte, i) => bytes[at + i] === byte);
const CHECK_CHUNK = 1 << 20;

// The server's size rule (HERMESWEB_ATTACHMENT_MAX_BYTES, in the page's data), in its own words,
// so a file too large is refused at once on either page and the same way.
function tooLarge(file, maxBytes) {
  return maxBytes && file.size > maxBytes ? `An attachment may hold at most ${maxBytes} bytes.` : null;
}

// Why the server would refuse `file` for its content, or null when it takes it (size aside:
// `tooLarge` says that).
export async function refusal(file) {
  if (!file.size) return UNSUPPORTED;
  const head = new Uint8Array(await file.slice(0, 16).arrayBuffer());
  if (IMAGE_MAGIC.some((magic) => startsWith(head, magic)) || (startsWith(head, RIFF) && startsWith(head, WEBP, 8))) return null;
  const decoder = new TextDecoder('utf-8', { fatal: true });
  try {
    // A slice at a time: a large file is not read into memory whole.
    for (let at = 0; at < file.size; at += CHECK_CHUNK) {
      const bytes = new Uint8Array(await file.slice(at, at + CHECK_CHUNK).arrayBuffer());
      if (bytes.includes(0)) return UNSUPPORTED;
      decoder.decode(bytes, { stream: true });
    }
    decoder.decode();
  } catch {
    return UNSUPPORTED;
  }
  return null;
}

async function upload(sessionId, file) {
  const form = new FormData();
  form.append('file', file, file.name || 'pasted.png');
  let response;
  try {
    response = await fetch(`/api/sessions/${encodeURIComponent(sessionId)}/attachments`, {
      method: 'POST',
      headers: { Accept: 'application/json', 'X-CSRFToken': csrfToken() },
      credentials: 'same-origin',
      body: form,
    });
  } catch (error) {
    throw new NetworkError(error);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    if (response.status === 401) toLogin();
    throw new ApiError(response.status, data?.code || `http_${response.status}`, data?.message || response.statusText);
  }
  return data;
}

// What the server may take if asked again: its upload failed on the way, not by a rule.
const retryable = (error) => error instanceof NetworkError || (error instanceof ApiError && (error.status >= 500 || error.status === 429));

// One attachment as a chip: a thumbnail (images) or a file badge, its name and size.
function chip(attachment, { src, remove, retry, state = 'ready', message = '' } = {}) {
  const name = attachment.name || 'attachment';
  const image = isImage(attachment.mime_type);
  // The thumbnail is the uploaded file itself (owner-only URL): none until the upload is done.
  const preview =
    image && src
      ? h('img', { class: 'attachment-thumb', src, alt: name, loading: 'lazy', decoding: 'async' })
      : h('span', { class: 'attachment-icon', 'aria-hidden': 'true', text: image ? 'IMG' : badge(name) });
  const label = h(
    'span',
    { class: 'attachment-label' },
    h('span', { class: 'attachment-name', text: name }),
    h('span', { class: 'attachment-size', text: state === 'uploading' ? 'uploading…' : state === 'error' ? message : formatSize(attachment.size ?? 0) }),
  );
  // A sent attachment opens in a new tab (the owner-only content URL); a pending one does not link.
  const body =
    attachment.id && !remove
      ? h('a', { class: 'attachment-link', href: contentUrl(attachment.id), target: '_blank', rel: 'noopener', title: `Open ${name}` }, preview, label)
      : h('span', { class: 'attachment-link' }, preview, label);
  return h(
    'li',
    { class: 'attachment', dataset: { state, kind: image ? 'image' : 'file', ...(attachment.id ? { attachmentId: String(attachment.id) } : {}) } },
    body,
    retry ? h('button', { type: 'button', class: 'attachment-remove attachment-retry', 'aria-label': `Retry ${name}`, title: `Upload ${name} again`, text: '↻', onclick: retry }) : null,
    remove ? h('button', { type: 'button', class: 'attachment-remove', 'aria-label': `Remove ${name}`, title: `Remove ${name}`, text: '×', onclick: remove }) : null,
  );
}

// A turn's attachments ({id, name, mime_type, size}), as shown under the user's prompt.
export function renderAttachmentList(attachments) {
  const list = (attachments || []).filter((a) => a && a.id);
  const mentioned = (attachments || []).filter((a) => a && a.mention); // `@` paths (mentions.js)
  if (!list.length && !mentioned.length) return null;
  return h(
    'ul',
    { class: 'attachments', 'aria-label': list.length + mentioned.length === 1 ? 'Attachment' : `${list.length + mentioned.length} attachments` },
    list.map((a) => chip(a, { src: isImage(a.mime_type) ? contentUrl(a.id) : undefined })),
    mentioned.map((a) => mentionChip(a.mention)),
  );
}

// The composer's pending attachments: upload on add, remove before send, hand ids to the message.
export class AttachmentTray {
  // `maxBytes`: the server's size limit (null: unknown, the upload says).
  constructor(listEl, { onChange, maxBytes = null } = {}) {
    this.listEl = listEl;
    this.onChange = onChange || (() => {});
    this.maxBytes = maxBytes;
    this.sessionId = null;
    this.deferred = false;
    this.items = [];
    this.counter = 0;
  }

  get enabled() {
    return this.sessionId !== null || this.deferred;
  }

  enable(sessionId) {
    this.sessionId = sessionId;
    this.onChange();
  }

  // No session yet (a project's page): files are kept, shown, and uploaded by `uploadTo`.
  defer() {
    this.deferred = true;
    this.onChange();
  }

  // Before a session is created for them: rejects naming the first file the server would refuse.
  async check() {
    await Promise.all(this.items.map((item) => item.checked));
    const refused = this.items.find((item) => item.refused);
    if (refused) throw new Error(`${refused.attachment.name}: ${refused.message}`);
  }

  // Upload what waits (and what failed before) to the session just created; resolves with every
  // uploaded attachment, or rejects naming the first file that could not go up (its `code` too).
  async uploadTo(sessionId) {
    this.enable(sessionId);
    const waiting = this.items.filter((item) => item.file && !item.refused && (item.state === 'pending' || item.state === 'error'));
    await Promise.all(waiting.map((item) => this.start(item)));
    const failed = this.items.find((item) => item.state === 'error');
    if (failed) throw Object.assign(new Error(`${failed.attachment.name}: ${failed.message}`), { code: failed.code });
    return this.ready();
  }

  // The files a message sent now would leave out: their chips say why. None on a project's page,
  // where Send uploads again or refuses (`check`, `uploadTo`).
  failed() {
    return this.deferred ? [] : this.items.filter((item) => item.state === 'error');
  }

  // Uploads still running: the message waits for them.
  get busy() {
    return this.items.some((item) => item.state === 'uploading');
  }

  // The uploaded ones, as a message stores them.
  ready() {
    return this.items.filter((item) => item.state === 'ready').map((item) => item.attachment);
  }

  add(files) {
    if (!this.enabled) return;
    for (const file of files) {
      const item = {
        key: ++this.counter,
        state: 'pending',
        message: '',
        file,
        attachment: { name: file.name || 'pasted image', mime_type: file.type, size: file.size },
      };
      this.items.push(item);
      const large = tooLarge(file, this.maxBytes);
      if (large) {
        Object.assign(item, { state: 'error', message: large, refused: true });
        continue;
      }
      if (this.sessionId !== null) {
        this.start(item);
        continue;
      }
      if (isImage(file.type)) previewLocally(item, () => this.render());
      item.state = 'checking';
      item.checked = refusal(file).then((message) => {
        item.state = message ? 'error' : 'pending';
        item.message = message || '';
        item.refused = !!message;
        this.render();
      });
    }
    this.render();
  }

  // One file's upload; settles (never rejects) once the item is ready or failed.
  start(item) {
    item.state = 'uploading';
    item.message = '';
    item.retryable = false;
    this.render();
    return upload(this.sessionId, item.file).then(
      (attachment) => {
        if (!this.items.includes(item)) return; // removed meanwhile: not sent
        item.attachment = attachment;
        item.state = 'ready';
        item.file = null;
        item.src = isImage(attachment.mime_type) ? contentUrl(attachment.id) : undefined;
        this.render();
      },
      (error) => {
        item.state = 'error';
        item.message = error.message || 'upload failed';
        item.code = error.code;
        item.retryable = retryable(error);
        this.render();
      },
    );
  }

  remove(key) {
    this.items = this.items.filter((i) => i.key !== key);
    this.render();
  }

  clear() {
    this.items = [];
    this.render();
  }

  // Uploaded attachments back into the tray (a refused message's, a turn's edited again).
  restore(attachments) {
    if (!this.enabled) return;
    for (const attachment of attachments || []) {
      if (this.items.some((item) => item.state === 'ready' && item.attachment.id === attachment.id)) continue;
      const src = isImage(attachment.mime_type) ? contentUrl(attachment.id) : undefined;
      this.items.push({ key: ++this.counter, state: 'ready', message: '', attachment, src });
    }
    this.render();
  }

  render() {
    this.listEl.hidden = !this.items.length;
    this.listEl.replaceChildren(
      ...this.items.map((item) =>
        chip(item.attachment, {
          src: item.src,
          state: item.state,
          message: item.message,
          remove: () => this.remove(item.key),
          retry: item.state === 'error' && item.retryable && item.file ? () => this.start(item) : null,
        }),
      ),
    );
    this.onChange();
  }
}

// A waiting image's thumbnail before it is uploaded: a data: URL (the page's CSP allows no blob:).
function previewLocally(item, done) {
  const reader = new FileReader();
  reader.addEventListener('load', () => {
    item.src = reader.result;
    done();
  });
  reader.readAsDataURL(item.file);
}

// Files carried by a paste or a drop (none for plain text).
export function filesOf(transfer) {
  return transfer?.files?.length ? [...transfer.files] : [];
}
