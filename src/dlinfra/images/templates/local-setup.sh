#!/bin/sh
# What a local VM image needs beyond Debian's packages: the hardware glue of qemu (a root disk,
# a serial console), cloud-init limited to the NoCloud seed the VM launcher attaches, and the
# stand-in for what a cloud base image ships (an AWS CLI). Runs as root in the image's chroot.
set -eu
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' > /etc/fstab
echo dlinfra-node > /etc/hostname
printf 'datasource_list: [ NoCloud, None ]\n' > /etc/cloud/cloud.cfg.d/90_dpkg.cfg
# Only the cloud-init modules a node's boot uses: write_files and runcmd (dlinfra's user-data), the
# vendor-data script (the emulated platform's), the hostname. Under software emulation every other
# module costs seconds: locale-gen, a default user, host keys for an sshd the image does not have.
cat > /etc/cloud/cloud.cfg.d/91_dlinfra_modules.cfg <<'CFG'
cloud_init_modules: [write_files, set_hostname, update_hostname, update_etc_hosts]
cloud_config_modules: [runcmd]
cloud_final_modules:
  [write_files_deferred, scripts_vendor, scripts_per_once, scripts_per_boot, scripts_per_instance,
   scripts_user, final_message, power_state_change]
CFG
# The second serial port is the VM's interactive console (what EC2's serial console is to an
# instance): a root shell for whoever holds the socket the launcher binds it to, never a network port.
mkdir -p /etc/systemd/system/serial-getty@ttyS1.service.d
cat > /etc/systemd/system/serial-getty@ttyS1.service.d/autologin.conf <<'UNIT'
[Service]
ExecStart=
ExecStart=-/sbin/agetty --autologin root --noclear --keep-baud 115200,57600,38400,9600 %I $TERM
UNIT
ln -sf /lib/systemd/system/serial-getty@.service \
    /etc/systemd/system/getty.target.wants/serial-getty@ttyS1.service
# The root disk and the seed are virtio disks: an initramfs with just their drivers. Debian's generic
# one carries every storage driver, and unpacking and probing them all is half a minute of a boot
# under software emulation (measured: cloud-init starts 33 s after power-on instead of 57 s).
sed -i 's/^MODULES=.*/MODULES=list/' /etc/initramfs-tools/initramfs.conf
printf 'virtio_pci\nvirtio_blk\n' >> /etc/initramfs-tools/modules
update-initramfs -u -k all
# Cloud base images come with a current AWS CLI (the Deep Learning AMI's v2); Debian's 2.9 predates
# the shared config's endpoint_url, which an emulator's vendor-data relies on.
python3 -m venv /opt/awscli
/opt/awscli/bin/pip install --quiet --no-index --find-links /tmp/dlinfra-build/wheelhouse awscli
ln -sf /opt/awscli/bin/aws /usr/local/bin/aws
